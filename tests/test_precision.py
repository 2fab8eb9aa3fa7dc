"""Mixed precision and the attention paths: bf16 compute keeps float32 parameters, optimizer
states and gradient sums, halves the hand-offs, trains like float32, and pipelines exactly like
single-device bf16; the fused attention equals the exact one where the math is the same."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from skyjax import baseline, data, optim
from skyjax.config import base_config, validate_config
from skyjax.models import bert, modeling
from skyjax.models.build import build_model, model_config, resolve_compute_dtype
from skyjax.profile.codec_times import output_likes
from skyjax.programs.stage import StageProgram
from skyjax.tree import tree_nbytes
from tests.helpers import (BATCH, _CFG, executor, make_batch, reference_losses, rng_for)


def _chain(compute_dtype="float32", attention="exact", **fields):
    cfg = bert.BertConfig(**{**_CFG, **fields, "compute_dtype": compute_dtype,
                             "attention": attention})
    return bert.units(bert.BertForSequenceClassification(cfg, nnx.Rngs(0)), "layer")


def _carry(step=0):
    b = make_batch(step)
    return bert.initial_carry(b["input_ids"], b["token_type_ids"], b["attention_mask"]), b


def test_auto_is_bfloat16_on_accelerators_and_float32_on_cpu():
    assert resolve_compute_dtype("auto", "cpu") == "float32"
    assert resolve_compute_dtype("auto", "gpu") == "bfloat16"
    assert resolve_compute_dtype("auto", "tpu") == "bfloat16"
    assert resolve_compute_dtype("float32", "gpu") == "float32"
    assert resolve_compute_dtype("auto", {"gpu", "cpu"}) == "float32"  # one rule for the job
    assert resolve_compute_dtype("auto") == "float32"  # this host


def test_a_bad_compute_dtype_or_attention_is_refused_naming_the_key():
    config = base_config()
    config.train.compute_dtype = "float16"
    with pytest.raises(ValueError, match=r"config\.train\.compute_dtype='float16'"):
        validate_config(config)
    config = base_config()
    config.model.attention = "flash"
    with pytest.raises(ValueError, match=r"config\.model\.attention='flash'"):
        validate_config(config)


def test_a_profile_measured_in_another_dtype_is_refused_naming_the_keys(tmp_path):
    from skyjax import train
    from skyjax.cluster import cluster_from_config
    from skyjax.models.build import abstract_chain
    from skyjax.profile.format import save_profile
    from tests.helpers import make_profile

    config = base_config()
    chain = abstract_chain(config.model, 0, "layer", "bfloat16")
    profile = make_profile(np.ones((len(chain), 1)))
    profile.extra["profiler"] = {"dtype": "float32"}  # as the profiler records it
    save_profile(profile, str(tmp_path / "p.json"))
    config.profile.path = str(tmp_path / "p.json")
    cluster = cluster_from_config(config, jax.devices()[:1])
    with pytest.raises(ValueError, match=r"config\.profile\.path=.*measured in float32.*"
                                         r"computes in bfloat16 \(config\.train\.compute_dtype"):
        train.profile_phase(config, chain, str(tmp_path), cluster)
    assert train.profile_phase(config, abstract_chain(config.model, 0, "layer"), str(tmp_path),
                               cluster).num_units == len(chain)


def test_numerics_stay_out_of_hugging_face_config_files():
    cfg = modeling.BertConfig(compute_dtype="bfloat16", attention="fused")
    hf = cfg.to_hf()
    assert "compute_dtype" not in hf and "attention" not in hf
    # a config.json that happens to carry these names does not set how skyjax computes
    back = modeling.BertConfig.from_hf({**hf, "compute_dtype": "bfloat16", "attention": "x"})
    assert (back.compute_dtype, back.attention) == ("float32", "exact")
    config = base_config()
    got = model_config(config.model, "bfloat16")
    assert (got.compute_dtype, got.attention) == ("bfloat16", config.model.attention)


def test_bf16_hand_offs_and_saved_activations_are_half_of_float32():
    carry, batch = _carry()
    f32, b16 = (output_likes(_chain(d), carry) for d in ("float32", "bfloat16"))
    for a, b in zip(f32[:-1], b16[:-1]):  # every hand-off but the logits
        assert b["hidden"].dtype == jnp.bfloat16
        assert tree_nbytes(b["hidden"]) * 2 == tree_nbytes(a["hidden"])
        assert b["attention_mask"].dtype == a["attention_mask"].dtype  # integers travel as is
    assert f32[-1]["logits"].dtype == b16[-1]["logits"].dtype == jnp.float32  # loss in float32

    def residuals(dtype):  # what a forward keeps per micro-batch for its backward
        chain = _chain(dtype)
        prog = StageProgram(chain[1:3], is_last=False, microbatches=1)
        c = output_likes(chain[:1], carry)[0]
        params = [u.params for u in chain[1:3]]
        return jax.eval_shape(prog.forward, params, c, rng_for(0, 0, BATCH))[1], params

    (r32, params), (r16, _) = residuals("float32"), residuals("bfloat16")
    # under half (below float32 the LayerNorms' float32 internals and the softmax are recomputed
    # in the backward, not kept) ...
    assert tree_nbytes(r16) <= 0.5 * tree_nbytes(r32), (tree_nbytes(r16), tree_nbytes(r32))
    # ... and no bf16 copy of a weight matrix is kept per micro-batch (backward casts them again)
    kernels = {x.shape for x in jax.tree.leaves(params) if x.ndim == 2}
    assert not [r for r in r16 if r.dtype == jnp.bfloat16 and r.shape in kernels]


@pytest.mark.slow
def test_pipelined_bf16_training_equals_single_device_bf16_and_keeps_float32_state():
    steps, m, clip = 2, 2, 0.5
    chain = _chain("bfloat16")
    want = reference_losses(chain, steps, m, clip, jit=True)
    ex = executor(chain, [(0, 2), (2, 5)], "1f1b", m, optax.adamw(1e-3), max_grad_norm=clip)
    got = [ex.train_step(step, make_batch(step)).loss for step in range(steps)]
    stage = ex.stages[0]
    assert stage.out_like["hidden"].dtype == jnp.bfloat16  # what it hands on
    state_dtypes = {x.dtype for x in jax.tree.leaves((ex.unit_params(), stage.state.opt_state,
                                                      stage.state.grads))
                    if jnp.issubdtype(x.dtype, jnp.floating)}
    ex.close()
    # XLA may keep a bf16 intermediate in float32 inside a fusion (excess precision), and
    # fusions end at stage boundaries: equal to well within bf16's rounding (2**-8), not bit
    # for bit
    np.testing.assert_allclose(got, want, rtol=5e-4)
    assert state_dtypes == {jnp.dtype(jnp.float32)}  # master weights, moments, gradient sums


@pytest.mark.slow
def test_fifty_demo_steps_in_bf16_stay_within_two_percent_of_float32():
    config = base_config()  # configs/local_demo.py
    losses = {}
    for dtype in ("float32", "bfloat16"):
        chain = bert.units(build_model(config.model, config.train.seed, dtype), "layer")
        optimizer = optim.make_optimizer(config.train)
        step_fn = baseline.make_train_step(chain, optimizer, config.train.seed, 1)
        params = [u.params for u in chain]
        state = optimizer.init(params)
        batches = data.train_batches(config)
        out = []
        for step in range(50):
            params, state, metrics = step_fn(params, state, next(batches), step)
            out.append(float(metrics["loss"]))
        losses[dtype] = np.array(out)
    f32, b16 = losses["float32"], losses["bfloat16"]
    assert not np.array_equal(f32, b16)
    # Until the loss takes off (it falls from step ~33 on) bf16 stays within 0.04 % per step.
    np.testing.assert_allclose(b16[:30], f32[:30], rtol=0.005)
    # Once it falls fast, one 32-example batch's loss moves by up to ~20 % for a
    # perturbation of the weights at bf16's rounding: float32 trained from the same weights
    # rounded to bf16 once differs from float32 by up to 13 % per step there. Compared over the
    # 50 steps
    assert abs(b16.mean() / f32.mean() - 1) < 0.02, (b16.mean(), f32.mean())


@pytest.mark.parametrize("train", [False, True])
def test_fused_attention_equals_the_exact_one_without_probability_dropout(train):
    carry, _ = _carry(3)  # rows with padded keys
    keys = rng_for(0, 0, BATCH)
    same = dict(hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.0)
    exact, fused = _chain(attention="exact", **same), _chain(attention="fused", **same)
    params = [u.params for u in exact]
    want = bert.apply_units(exact, params, carry, keys, train)["logits"]
    got = bert.apply_units(fused, params, carry, keys, train)["logits"]
    np.testing.assert_allclose(got, want, atol=2e-6, rtol=0)


def test_the_attention_path_keeps_the_math_unless_fused_is_asked_for(monkeypatch):
    cfg = modeling.BertConfig(attention_probs_dropout_prob=0.1)
    path = lambda attention, train: modeling.attention_path(  # noqa: E731
        dataclasses.replace(cfg, attention=attention), train, jnp.bfloat16)
    assert [path("auto", t) for t in (False, True)] == ["exact", "exact"]  # CPU: no cuDNN
    assert [path("fused", t) for t in (False, True)] == ["xla", "xla"]
    monkeypatch.setattr(modeling, "cudnn_attention_applies", lambda dtype, head_dim: True)
    # cuDNN's kernel has no dropout on the probabilities: "auto" uses it only where none applies
    assert [path("auto", t) for t in (False, True)] == ["cudnn", "exact"]
    assert [path("fused", t) for t in (False, True)] == ["cudnn", "cudnn"]
    assert path("exact", False) == "exact"
    no_dropout = dataclasses.replace(cfg, attention="auto", attention_probs_dropout_prob=0.0)
    assert modeling.attention_path(no_dropout, True, jnp.bfloat16) == "cudnn"
