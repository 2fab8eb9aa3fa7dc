"""Checkpoints indexed by unit (docs/design.md, "Checkpoints"): every unit's params and optimizer
state by parameter path, written by the processes that own them, committed once complete under
``WORKDIR/checkpoints/<step>/``, restored under any plan, granularity or process count.

* ``layout``: directories, commit (atomic rename), pruning (file operations only);
* ``names``: tensor names of a unit's state, by parameter path;
* ``store``: one process's safetensors file; reading tensors by name;
* ``manager``: ``CheckpointManager`` (save, commit after every process wrote);
* ``restore``: the latest checkpoint, compatibility checks, a unit's state back;
* ``relaxed``: a relaxed averaging's state (residuals, anchors, outer momenta, each pipeline's
  own replica where replicas differ): its tensors, what a commit expects, its restore;
* ``run``: the trainer's calls (``prepare``, ``restored_states``, ``restore_relaxed``,
  ``make_manager``, ``after_step``).
"""

from skyjax.checkpoint.layout import checkpoints_dir, committed_steps, latest_step
from skyjax.checkpoint.manager import CheckpointError, CheckpointManager, expected_tensors
from skyjax.checkpoint.restore import (CheckpointMismatch, Resume, check_compatible, find_resume,
                                       restore_units)
from skyjax.checkpoint.run import (after_step, make_manager, prepare, replace_earlier,
                                   restore_relaxed, restored_states)

__all__ = ["CheckpointError", "CheckpointManager", "CheckpointMismatch", "Resume", "after_step",
           "check_compatible", "checkpoints_dir", "committed_steps", "expected_tensors",
           "find_resume", "latest_step", "make_manager", "prepare", "replace_earlier",
           "restore_relaxed", "restore_units", "restored_states"]
