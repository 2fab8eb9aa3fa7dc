"""``CheckpointError`` is one class (issue 53, item 8): a pretrained checkpoint that does not fit
and a save of skyjax's own that cannot be committed are caught by one ``except``."""

from __future__ import annotations

from skyjax import failures
from skyjax.names import EXIT_BAD_INPUT


def test_checkpoint_error_is_one_class():
    """A pretrained checkpoint that does not fit and a save that cannot be committed raise the
    same class, so one ``except`` catches both, and both are bad input (exit 64)."""
    from skyjax import checkpoint
    from skyjax.checkpoint import manager
    from skyjax.models import bert, hf_loading

    assert checkpoint.CheckpointError is manager.CheckpointError is hf_loading.CheckpointError
    assert bert.CheckpointError is hf_loading.CheckpointError
    assert failures.exit_status(checkpoint.CheckpointError("x")) == EXIT_BAD_INPUT
