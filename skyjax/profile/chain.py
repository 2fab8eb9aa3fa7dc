"""What the profiler measures: the :class:`Workload` (model shape, micro-batch, granularity,
optimizer), the units to time (:class:`ChainSpec`) and a sample micro-batch to time them on.

The orchestrators (``skyjax.train.profile_phase``, ``python -m skyjax.profile``) build a
:class:`Workload` once (:meth:`Workload.from_config`); nothing below them reads the config. A
model given only by its shape is profiled on a one-layer skeleton whose layer stands for every
layer (:func:`skeleton_chain`), so BERT-large with 160 layers costs no more than one layer.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import numpy as np

from skyjax.models import bert
from skyjax.models.build import model_config, resolve_compute_dtype
from skyjax.profile.format import (Profile, check_measured_for, config_keys, model_record,
                                   run_microbatch)
from skyjax.tree import tree_nbytes


@dataclasses.dataclass(frozen=True)
class Workload:
    """What one profile measures, apart from the cluster and the options: everything here
    changes the numbers and is hashed into the cache key (:func:`skyjax.profile.cache.cache_key`).

    ``optimizer`` *describes* the optimizer whose state is sized (the optimizer itself is passed
    separately): ``{"name": "adamw", "clip": bool}``.
    """

    model: bert.BertConfig
    microbatch: tuple[int, int]  # (size, seq_len)
    granularity: str
    optimizer: dict
    dtype: str = "float32"

    @classmethod
    def from_config(cls, config: Any) -> "Workload":
        """For the orchestrators: the model shape (:func:`model_config`), the micro-batch
        (``data.batch_size / pipeline.microbatches`` x ``data.seq_len``), the granularity and the
        optimizer description of ``config``, computing in its resolved
        ``train.compute_dtype``."""
        dtype = resolve_compute_dtype(config.train.compute_dtype)
        clip = float(getattr(config.train, "grad_clip_norm", 0.0) or 0.0)
        return cls(model=model_config(config.model, dtype), dtype=dtype,
                   microbatch=run_microbatch(config),
                   granularity=str(config.allocation.granularity),
                   optimizer={"name": "adamw", "clip": clip > 0})

    def record(self) -> dict:
        """profile.json's ``model`` record of this workload (:func:`format.model_record`), so that
        a run given the profile can check it was measured for its model."""
        shape = dataclasses.asdict(self.model)
        if shape.get("intermediate_size", 0) is None:  # a decoder's default (GPT-2's n_inner)
            shape["intermediate_size"] = self.model.ffn_size
        return model_record(shape, attention=self.model.attention,
                            compute_dtype=self.dtype, granularity=self.granularity)


def check_given(profile: Profile, config: Any, dtype: str, warn: Callable[[str], None]
                ) -> None:
    """A profile given to a run (``config.profile.path``) must have been measured for the run's
    model and micro-batch (:func:`format.check_measured_for`; ``dtype``: the run's resolved compute
    dtype, its chain's); one without the record cannot be checked and is used with a ``warn`` line,
    unless the profiler's options name another compute dtype (its hand-off and activation bytes are
    2x off)."""
    where = f"config.profile.path={config.profile.path!r}"
    workload = dataclasses.replace(Workload.from_config(config), dtype=dtype)
    if check_measured_for(profile, workload.record(), workload.microbatch, where,
                          config_keys(config)):
        return
    measured = profile.extra.get("profiler", {})
    measured = measured.get("dtype") if isinstance(measured, dict) else None
    if measured and measured != workload.dtype:
        raise ValueError(f"{where} was measured in {measured}; this run computes in "
                         f"{workload.dtype} (config.train.compute_dtype="
                         f"{config.train.compute_dtype!r}), so its hand-off and activation bytes "
                         "are not this run's: profile again or set config.train.compute_dtype")
    warn(f"{where} has no model record (written before profiles had one, or not by the "
         "profiler): its model and micro-batch are not checked against this run's")


@dataclasses.dataclass
class ChainSpec:
    """The units to measure (``chain``) and the full model's units as indices into it."""

    chain: list[bert.Unit]
    names: list[str]  # one per unit of the full model
    rep: list[int]  # full-model unit -> index into chain
    kinds: list[str]
    param_bytes: list[int]  # per full-model unit


def full_chain(chain: list[bert.Unit]) -> ChainSpec:
    """Every unit measured as itself (identical ones are still timed once, see ``dedup_units``)."""
    n = len(chain)
    return ChainSpec(chain, [u.name for u in chain], list(range(n)), [u.kind for u in chain],
                     [tree_nbytes(u.params) for u in chain])


def model_units(model: Any, granularity: str, seed: int = 0) -> list[bert.Unit]:
    """The units of the model of shape ``model`` (a ``BertConfig``, or a decoder's
    ``DecoderConfig``), materialised."""
    from flax import nnx

    if hasattr(model, "num_labels"):
        return bert.units(bert.BertForSequenceClassification(model, rngs=nnx.Rngs(seed)),
                          granularity)
    from skyjax.models import decoder_units

    return decoder_units.units(decoder_units.DecoderForCausalLM(model, nnx.Rngs(seed)),
                               granularity)


def skeleton_chain(model: bert.BertConfig, granularity: str, seed: int = 0) -> ChainSpec:
    """A one-layer model's units standing for the ``model.num_hidden_layers`` identical layers."""
    layers = model.num_hidden_layers
    chain = model_units(dataclasses.replace(model, num_hidden_layers=1), granularity, seed)
    per_layer = len(chain) - 2
    names, rep = [chain[0].name], [0]
    for i in range(layers):
        for j in range(per_layer):
            names.append(chain[1 + j].name.replace("layer_0", f"layer_{i}", 1))
            rep.append(1 + j)
    names.append(chain[-1].name)
    rep.append(len(chain) - 1)
    return ChainSpec(chain, names, rep, [chain[r].kind for r in rep],
                     [tree_nbytes(chain[r].params) for r in rep])


def chain_spec(model: bert.BertConfig, granularity: str, chain: list[bert.Unit] | None,
               dedup_units: bool) -> ChainSpec:
    """The given chain, else a skeleton (identical layers measured once) or, with
    ``dedup_units=False``, the whole model."""
    if chain is not None:
        return full_chain(chain)
    if dedup_units:
        return skeleton_chain(model, granularity)
    return full_chain(model_units(model, granularity))


def sample_microbatch(model: bert.BertConfig, size: int, seq_len: int, seed: int = 0
                      ) -> tuple[dict, np.ndarray]:
    """A random micro-batch (first unit's carry, labels) of the profiled shape; a decoder's
    (no ``num_labels``) labels are next tokens, one per position."""
    rs = np.random.RandomState(seed)
    ids = rs.randint(1, model.vocab_size, size=(size, seq_len)).astype(np.int32)
    if not hasattr(model, "num_labels"):
        labels = rs.randint(0, model.vocab_size, size=(size, seq_len)).astype(np.int32)
        return bert.initial_carry(ids, None, np.ones_like(ids)), labels
    types = np.zeros_like(ids)
    types[:, seq_len // 2:] = 1 if model.type_vocab_size > 1 else 0
    mask = np.ones_like(ids)
    labels = rs.randint(0, model.num_labels, size=(size,)).astype(np.int32)
    return bert.initial_carry(ids, types, mask), labels
