"""The trainer's side of checkpoints, a few calls: whether and where to resume, which unit states
this process starts from under the current plan (and the relaxed averaging's state, once its
executor is built), and saving every ``config.checkpoint.every`` steps from inside the train loop
(``skyjax.train``)."""

from __future__ import annotations

from typing import Any, Sequence

import jax
from absl import logging

from skyjax.checkpoint import layout, relaxed
from skyjax.checkpoint.manager import CheckpointManager, UnitState
from skyjax.checkpoint.restore import (CheckpointMismatch, Resume, check_compatible, find_resume,
                                       restore_units, unit_source)


def run_identity(config: Any) -> dict:
    """What a checkpoint must share with the run that resumes it (besides the tensors): the
    seed, the dataset and, for string labels, their names in id order (the label mapping)."""
    from skyjax import data

    out = {"seed": int(config.train.seed), "dataset": str(config.data.name)}
    names = data.label_names(config)
    if names is not None:
        out["label_names"] = names
    return out


def prepare(config: Any, workdir: str) -> Resume | None:
    """The checkpoint this run resumes from (None: fresh, or ``config.checkpoint.resume`` off);
    raises ``CheckpointMismatch`` naming the first difference (seed, dataset, a unit's tensor),
    or the directory when checkpoints are there but none verifies or resuming is off (unless
    ``config.checkpoint.replace``: starting afresh over them would overwrite them), before
    anything is written to the workdir."""
    directory = layout.checkpoints_dir(workdir)
    layout.check_directory(directory)
    if not config.checkpoint.resume:
        steps = layout.step_dirs(directory)
        if steps and not config.checkpoint.replace:
            raise CheckpointMismatch(
                f"{directory} holds the checkpoints of an earlier run "
                f"(steps {', '.join(map(str, steps))}) and config.checkpoint.resume=False: set "
                f"--config.checkpoint.replace=True to delete them, or use another workdir")
        return None
    resume = find_resume(directory, replace=bool(config.checkpoint.replace))
    if resume is None:
        return None
    from skyjax import optim
    from skyjax.models import build

    chain = build.abstract_chain(config.model, config.train.seed, config.allocation.granularity)
    check_compatible(resume, run_identity(config), chain,
                     optim.make_optimizer(config.train, clip=False))
    if resume.step >= config.train.steps:
        raise CheckpointMismatch(f"checkpoint {resume.path} is at step {resume.step}, but "
                                 f"config.train.steps={config.train.steps}: nothing to train (raise "
                                 f"config.train.steps to continue, or use another workdir)")
    logging.info("resuming from %s (after step %d)", resume.path, resume.step)
    return resume


def replace_earlier(config: Any, workdir: str) -> list[int]:
    """With ``config.checkpoint.replace`` on, in a run that starts afresh (resuming off, or no
    checkpoint verified), deletes the earlier checkpoints (once this run's checks and plan have
    succeeded; damaged ones too), so that they cannot mix with this run's; returns the steps
    deleted."""
    if not config.checkpoint.replace:
        return []
    directory = layout.checkpoints_dir(workdir)
    steps = layout.step_dirs(directory)
    for step in steps:
        layout.delete_step(directory, step)
    if steps:
        logging.info("config.checkpoint.replace: deleted the earlier run's checkpoints %s",
                     steps)
    return steps


def restored_states(resume: Resume | None, chain: Sequence[Any], units: Sequence[int],
                    optimizer: Any) -> dict[int, UnitState] | None:
    """The states of ``units`` (this process's, under the current plan) from ``resume``, on the
    host (None when the run starts fresh)."""
    if resume is None:
        return None
    return restore_units(resume, chain, units, optimizer)


def restore_relaxed(resume: Resume | None, executor: Any, chain: Sequence[Any],
                    optimizer: Any) -> list[str]:
    """After the executor is built from ``restored_states``: the relaxed averaging's state
    (and each pipeline's own replica where replicas differ) from ``resume``
    (:func:`skyjax.checkpoint.relaxed.restore`); the names of the states restored."""
    if resume is None:
        return []
    return relaxed.restore(resume, executor, chain, optimizer,
                           lambda path: unit_source(resume, path))


def make_manager(config: Any, workdir: str, chain: Sequence[Any],
                 optimizer: Any) -> CheckpointManager:
    """The run's checkpoint manager (saving off when ``config.checkpoint.every`` is 0)."""
    run = {**run_identity(config), "granularity": config.allocation.granularity}
    kwargs: dict = {}
    if jax.process_count() > 1:
        from skyjax.transport import group as distributed

        kwargs = dict(process_index=jax.process_index(), num_processes=jax.process_count(),
                      client=distributed.key_value_client(), kv_get=distributed.kv_get,
                      timeout_s=max(600.0, float(config.cluster.peer_timeout_s)))
    return CheckpointManager(layout.checkpoints_dir(workdir), config.checkpoint.every,
                             config.checkpoint.keep, chain, optimizer, run,
                             total_steps=int(config.train.steps), **kwargs)


def after_step(manager: CheckpointManager | None, step: int, executor: Any) -> None:
    """Saves after ``step`` (0-based) when due: the state after ``step + 1`` steps."""
    if manager is not None and manager.due(step + 1):
        # a peer mode's replicas differ: "average now" makes them one model first
        from skyjax.runtime.decentralized import average_now

        average_now(executor, step)
        plan = executor.plan
        manager.save(step + 1, executor.unit_states(), extra_meta=relaxed.meta(plan),
                     extra=relaxed.entries(executor, manager.chain),
                     extra_expected=relaxed.expected(plan, manager.chain, manager.optimizer))
