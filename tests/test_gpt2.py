"""GPT-2 as a unit chain (skyjax/models/gpt2.py with the decoder modules): logits equal Hugging
Face's PyTorch ``GPT2LMHeadModel`` to 1e-5 in float32 on tiny random configs (tied and untied,
padding), at both granularities; dropout keys come from the position in the model, so the
granularity does not change a training forward; the parameters go back under HF's names; the
decoder FLOP model counts HF's parameters."""

from __future__ import annotations

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


def hf_config(tied: bool = True, **kw):
    fields = dict(vocab_size=64, n_embd=32, n_layer=2, n_head=4, n_positions=32, n_inner=None,
                  bos_token_id=0, eos_token_id=0, tie_word_embeddings=tied)
    fields.update(kw)
    return transformers.GPT2Config(**fields)


def saved_model(tmp_path, config):
    torch.manual_seed(1)
    hf = transformers.GPT2LMHeadModel(config).eval()
    with torch.no_grad():  # weights far from init so every term counts
        for p in hf.parameters():
            p.add_(0.2 * torch.randn_like(p))
    hf.save_pretrained(tmp_path)
    return hf


def padded(batch=3, seq=12, vocab=64, seed=0):
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, vocab, (batch, seq)).astype(np.int32)
    mask = np.ones_like(ids)
    for b in range(1, batch):
        mask[b, seq - 2 * b:] = 0
    return ids, mask


def hf_logits(hf, ids, mask=None):
    with torch.no_grad():
        out = hf(input_ids=torch.tensor(ids, dtype=torch.long),
                 attention_mask=None if mask is None else torch.tensor(mask, dtype=torch.long))
    return out.logits.numpy()


def chain_logits(model, granularity, ids, mask, rng=None, train=False):
    chain = decoder_units.units(model, granularity)
    carry = decoder_units.initial_carry(ids, mask)
    return np.asarray(apply_units(chain, [u.params for u in chain], carry, rng, train)["logits"])


@pytest.mark.parametrize("tied", [True, False])
def test_logits_match_hugging_face_at_both_granularities(tmp_path, tied):
    hf = saved_model(tmp_path, hf_config(tied))
    model = decoder_hf.from_pretrained(str(tmp_path))
    assert model.config.family == "gpt2" and model.config.tie_word_embeddings == tied
    ids, mask = padded()
    want = hf_logits(hf, ids, mask)
    np.testing.assert_allclose(np.asarray(model(ids, mask)), want, atol=1e-5, rtol=0)
    np.testing.assert_allclose(np.asarray(model(ids)), hf_logits(hf, ids), atol=1e-5, rtol=0)
    for granularity in ("layer", "sublayer"):
        np.testing.assert_allclose(chain_logits(model, granularity, ids, mask), want,
                                   atol=1e-5, rtol=0)


def test_original_checkpoint_names_load(tmp_path):
    """The hub's gpt2 names its body without ``transformer.`` and keeps the causal-mask
    buffers; both load."""
    from safetensors.numpy import load_file, save_file

    hf = saved_model(tmp_path, hf_config())
    file = str(tmp_path / "model.safetensors")
    tensors = {k.removeprefix("transformer."): v for k, v in load_file(file).items()}
    tensors["h.0.attn.bias"] = np.tril(np.ones((1, 1, 32, 32), np.float32))
    save_file(tensors, file)
    ids, mask = padded(seed=2)
    got = np.asarray(decoder_hf.from_pretrained(str(tmp_path))(ids, mask))
    np.testing.assert_allclose(got, hf_logits(hf, ids, mask), atol=1e-5, rtol=0)


def test_a_foreign_tensor_is_named(tmp_path):
    from safetensors.numpy import load_file, save_file

    saved_model(tmp_path, hf_config())
    file = str(tmp_path / "model.safetensors")
    tensors = load_file(file)
    tensors["transformer.h.0.attn.q_proj.weight"] = np.zeros((32, 32), np.float32)
    save_file(tensors, file)
    with pytest.raises(ValueError, match="q_proj.weight: unknown to GPT2LMHeadModel"):
        decoder_hf.from_pretrained(str(tmp_path))


def test_training_dropout_is_keyed_by_position_not_by_the_cut():
    cfg = DecoderConfig.from_hf(hf_config().to_dict())
    assert cfg.hidden_dropout_prob == 0.1 and cfg.attention_probs_dropout_prob == 0.1
    model = decoder_units.DecoderForCausalLM(cfg, nnx.Rngs(2))
    ids, mask = padded(seed=3)
    rng = jax.random.key(7)
    layer = chain_logits(model, "layer", ids, mask, rng, True)
    sub = chain_logits(model, "sublayer", ids, mask, rng, True)
    np.testing.assert_allclose(layer, sub, atol=1e-6, rtol=0)
    assert np.abs(layer - np.asarray(model(ids, mask))).max() > 1e-3  # dropout is on


@pytest.mark.parametrize("tied", [True, False])
def test_params_go_back_under_hugging_face_names(tmp_path, tied):
    config = hf_config(tied)
    hf = saved_model(tmp_path, config)
    model = decoder_hf.from_pretrained(str(tmp_path))
    state = decoder_hf.to_hf_state_dict(model_params(model), model.config)
    fresh = transformers.GPT2LMHeadModel(config).eval()
    result = fresh.load_state_dict({k: torch.tensor(v) for k, v in state.items()}, strict=True)
    assert not result.missing_keys and not result.unexpected_keys
    ids, mask = padded(seed=4)
    np.testing.assert_allclose(hf_logits(fresh, ids, mask), hf_logits(hf, ids, mask), atol=1e-6)
    back = DecoderConfig.from_hf(model.config.to_hf())
    assert back == model.config


@pytest.mark.parametrize("tied", [True, False])
def test_flop_model_counts_hugging_face_parameters(tied):
    hf = transformers.GPT2LMHeadModel(hf_config(tied))
    shape = flops.DecoderShape(family="gpt2", layers=2, hidden=32, heads=4, ffn=128, seq=8,
                               batch=2, vocab=64, positions=32, tied=tied)
    for granularity, n in (("layer", 4), ("sublayer", 6)):
        units = flops.decoder_units(shape, granularity)
        assert len(units) == n
        copy = sum(u.get("tied_params", 0) for u in units)
        assert sum(u["params"] for u in units) - copy == hf.num_parameters()
    layer, sub = flops.decoder_units(shape, "layer"), flops.decoder_units(shape, "sublayer")
    assert sum(u["flops"] for u in layer) == sum(u["flops"] for u in sub)


def test_build_dispatches_on_model_type(tmp_path):
    saved_model(tmp_path, hf_config())
    cfg = ml_collections.ConfigDict({"pretrained": str(tmp_path), "attention": "exact"})
    assert build.decoder_family(cfg) == "gpt2"
    chain = build.abstract_chain(cfg, 0, "layer")
    assert [u.name for u in chain] == ["embeddings", "layer_0", "layer_1", "head"]
    made = build.materialize(build.UnitInitializer(cfg, 0), chain, range(4))
    ids, mask = padded(seed=6)
    got = apply_units(made, [u.params for u in made], decoder_units.initial_carry(ids, mask),
                      None, False)["logits"]
    want = build.build_model(cfg, 0)(ids, mask)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


def test_segment_ids_in_the_mask_keep_attention_within_documents():
    """Packed text with config.data.document_mask: the runtime's carry holds each token's
    document + 1 in the attention mask (runtime.batches.host_carry); the model's causal mask
    is then data.lm_text.block_causal_mask on every real query, and a 0/1 mask is unchanged."""
    from skyjax.data import lm_text
    from skyjax.models import decoder
    from skyjax.runtime.batches import host_carry

    seg = np.array([[0, 0, 0, 1, 1, 2, 2, 3], [0, 1, 1, 1, 1, 1, 2, 2]], np.int32)
    mask = np.ones_like(seg)
    mask[1, 6:] = 0
    carry = host_carry({"input_ids": np.zeros_like(seg), "attention_mask": mask,
                        "segment_ids": seg, "labels": seg})
    got = np.asarray(decoder.causal_mask(carry["attention_mask"])) > 0
    want = lm_text.block_causal_mask(seg, mask)
    real = mask[:, :, None] > 0
    np.testing.assert_array_equal(got & real, want & real)
    plain = np.asarray(decoder.causal_mask(mask)) > 0
    np.testing.assert_array_equal(plain, np.tril(np.ones((8, 8), bool))[None] & (mask[:, None] > 0))
