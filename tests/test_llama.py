"""The Llama family as a unit chain (skyjax/models/llama.py, decoder.py, decoder_units.py,
decoder_hf.py): logits equal Hugging Face's PyTorch ``LlamaForCausalLM`` to 1e-5 in float32 on
tiny random configs (grouped-query attention, tied and untied embeddings, padding), at both
granularities; the parameters go back under HF's names with no missing or unexpected key; the
decoder FLOP model counts HF's parameters; ``build`` makes a decoder chain unit by unit."""

from __future__ import annotations

import dataclasses

import jax
import ml_collections
import numpy as np
import pytest
from flax import nnx

from skyjax.models import build, decoder_hf, decoder_units
from skyjax.models.decoder import DecoderConfig
from skyjax.models.units import apply_units, model_params
from skyjax.profile import flops

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")


def hf_config(tied: bool = False, kv_heads: int = 2, **kw):
    fields = dict(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=kv_heads,
                  max_position_embeddings=64, rope_theta=500.0, tie_word_embeddings=tied,
                  rms_norm_eps=1e-5)
    fields.update(kw)
    return transformers.LlamaConfig(**fields)


def saved_model(tmp_path, config):
    torch.manual_seed(0)
    hf = transformers.LlamaForCausalLM(config).eval()
    with torch.no_grad():  # weights far from init (unit norms, zero biases) so every term counts
        for p in hf.parameters():
            p.add_(0.2 * torch.randn_like(p))
    hf.save_pretrained(tmp_path)
    return hf


def padded(batch=3, seq=11, vocab=64, seed=0, left=False):
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, vocab, (batch, seq)).astype(np.int32)
    mask = np.ones_like(ids)
    for b in range(1, batch):
        if left:
            mask[b, :2 * b] = 0
        else:
            mask[b, seq - 2 * b:] = 0
    return ids, mask


def hf_logits(hf, ids, mask=None):
    with torch.no_grad():
        out = hf(input_ids=torch.tensor(ids, dtype=torch.long),
                 attention_mask=None if mask is None else torch.tensor(mask, dtype=torch.long))
    return out.logits.numpy()


def chain_logits(model, granularity, ids, mask):
    chain = decoder_units.units(model, granularity)
    carry = decoder_units.initial_carry(ids, mask)
    return np.asarray(apply_units(chain, [u.params for u in chain], carry, None, False)["logits"])


@pytest.mark.parametrize("tied,kv_heads", [(False, 2), (True, 1), (False, 4)])
def test_logits_match_hugging_face_at_both_granularities(tmp_path, tied, kv_heads):
    hf = saved_model(tmp_path, hf_config(tied, kv_heads))
    model = decoder_hf.from_pretrained(str(tmp_path))
    assert model.config.family == "llama" and model.config.kv_heads == kv_heads
    ids, mask = padded()
    want = hf_logits(hf, ids, mask)
    np.testing.assert_allclose(np.asarray(model(ids, mask)), want, atol=1e-5, rtol=0)
    np.testing.assert_allclose(np.asarray(model(ids)), hf_logits(hf, ids), atol=1e-5, rtol=0)
    for granularity in ("layer", "sublayer"):
        np.testing.assert_allclose(chain_logits(model, granularity, ids, mask), want,
                                   atol=1e-5, rtol=0)


def test_left_padding_matches_on_the_real_tokens(tmp_path):
    hf = saved_model(tmp_path, hf_config())
    model = decoder_hf.from_pretrained(str(tmp_path))
    ids, mask = padded(left=True, seed=3)
    got, want = np.asarray(model(ids, mask)), hf_logits(hf, ids, mask)
    np.testing.assert_allclose(got[mask > 0], want[mask > 0], atol=1e-5, rtol=0)


def test_padding_does_not_reach_the_real_tokens():
    model = decoder_units.DecoderForCausalLM(DecoderConfig.from_hf(hf_config().to_dict()),
                                             nnx.Rngs(0))
    ids, mask = padded(batch=2, seq=10)
    other = ids.copy()
    other[mask == 0] = (other[mask == 0] + 7) % 64
    a, b = np.asarray(model(ids, mask)), np.asarray(model(other, mask))
    np.testing.assert_allclose(a[mask > 0], b[mask > 0], atol=1e-6, rtol=0)


@pytest.mark.parametrize("tied", [False, True])
def test_params_go_back_under_hugging_face_names(tmp_path, tied):
    config = hf_config(tied)
    hf = saved_model(tmp_path, config)
    model = decoder_hf.from_pretrained(str(tmp_path))
    state = decoder_hf.to_hf_state_dict(model_params(model), model.config)
    fresh = transformers.LlamaForCausalLM(config).eval()
    result = fresh.load_state_dict({k: torch.tensor(v) for k, v in state.items()}, strict=True)
    assert not result.missing_keys and not result.unexpected_keys
    ids, mask = padded(seed=4)
    np.testing.assert_allclose(hf_logits(fresh, ids, mask), hf_logits(hf, ids, mask), atol=1e-6)
    once = decoder_hf.to_hf_state_dict(model_params(model), model.config, tied_copy=False)
    assert ("lm_head.weight" in once) == (not tied)


def test_tied_units_name_each_other_and_start_equal():
    cfg = DecoderConfig.from_hf(hf_config(tied=True).to_dict())
    model = decoder_units.DecoderForCausalLM(cfg, nnx.Rngs(3))
    for granularity, n in (("layer", 4), ("sublayer", 6)):
        chain = decoder_units.units(model, granularity)
        assert len(chain) == n
        [((i, a), (j, b))] = decoder_units.tied_pairs(chain)
        assert (i, j, a, b) == (0, n - 1, ("embed_tokens", "embedding"), ("lm_head", "embedding"))
        np.testing.assert_array_equal(chain[i].params["embed_tokens"]["embedding"],
                                      chain[j].params["lm_head"]["embedding"])
    untied = decoder_units.units(decoder_units.DecoderForCausalLM(
        dataclasses.replace(cfg, tie_word_embeddings=False), nnx.Rngs(3)))
    assert decoder_units.tied_pairs(untied) == []


def test_bf16_chain_computes_in_bf16_and_stays_close(tmp_path):
    saved_model(tmp_path, hf_config())
    f32 = decoder_hf.from_pretrained(str(tmp_path))
    bf16 = decoder_hf.from_pretrained(str(tmp_path), compute_dtype="bfloat16")
    ids, mask = padded(seed=5)
    chain = decoder_units.units(bf16, "sublayer")
    carry = chain[0].apply(chain[0].params, decoder_units.initial_carry(ids, mask), None, False)
    assert carry["hidden"].dtype == jax.numpy.bfloat16
    got = chain_logits(bf16, "sublayer", ids, mask)
    assert got.dtype == np.float32
    want = np.asarray(f32(ids, mask))
    assert np.abs(got - want).max() < 0.05 * np.abs(want).max()


@pytest.mark.parametrize("tied", [False, True])
def test_flop_model_counts_hugging_face_parameters(tied):
    config = hf_config(tied, intermediate_size=40)
    hf = transformers.LlamaForCausalLM(config)
    shape = flops.DecoderShape(family="llama", layers=2, hidden=32, heads=4, kv_heads=2,
                               ffn=40, seq=8, batch=2, vocab=64, positions=64, tied=tied)
    for granularity, n in (("layer", 4), ("sublayer", 6)):
        units = flops.decoder_units(shape, granularity)
        assert len(units) == n
        copy = sum(u.get("tied_params", 0) for u in units)
        assert sum(u["params"] for u in units) - copy == hf.num_parameters()
        assert copy == (64 * 32 if tied else 0)
        assert all(u["flops"] > 0 and u["out"] > 0 for u in units)


def test_build_makes_a_decoder_chain_unit_by_unit(tmp_path):
    saved_model(tmp_path, hf_config(tied=True))
    cfg = ml_collections.ConfigDict({"pretrained": str(tmp_path), "attention": "exact"})
    whole = decoder_units.units(build.build_model(cfg, 0), "sublayer")
    chain = build.abstract_chain(cfg, 0, "sublayer")
    assert [u.name for u in chain] == [u.name for u in whole] and chain[0].tied
    made = build.materialize(build.UnitInitializer(cfg, 0), chain, [0, len(chain) - 1])
    for i in (0, len(chain) - 1):
        jax.tree.map(np.testing.assert_array_equal, made[i].params, whole[i].params)
    random = ml_collections.ConfigDict(dict(model_type="llama", pretrained="", vocab_size=64,
                                            hidden_size=32, num_hidden_layers=2,
                                            num_attention_heads=4, num_key_value_heads=2,
                                            intermediate_size=48, tie_word_embeddings=True))
    model = build.build_model(random, 5)
    assert isinstance(build.model_config(random), DecoderConfig)
    chain = build.abstract_chain(random, 5, "layer")
    made = build.materialize(build.UnitInitializer(random, 5), chain, range(len(chain)))
    for unit, want in zip(made, decoder_units.units(model, "layer")):
        jax.tree.map(np.testing.assert_array_equal, unit.params, want.params)


def test_fused_attention_path_matches_hugging_face(tmp_path):
    hf = saved_model(tmp_path, hf_config())
    model = decoder_hf.from_pretrained(str(tmp_path), attention="fused")  # XLA's kernel on CPU
    ids, mask = padded(seed=6)
    chain = decoder_units.units(model, "sublayer")
    carry = decoder_units.initial_carry(ids, mask)
    for unit in chain:  # each unit jitted on its own, as a stage runs it
        carry = jax.jit(unit.apply, static_argnames="train")(unit.params, carry, None, train=False)
    np.testing.assert_allclose(np.asarray(carry["logits"]), hf_logits(hf, ids, mask), atol=1e-5,
                               rtol=0)
