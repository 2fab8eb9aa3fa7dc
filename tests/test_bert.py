"""BERT: Hugging Face parity, checkpoint loading errors, and units composing to the full model."""

import dataclasses
import functools
import json
import os
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from skyjax import metrics
from skyjax.models import bert, modeling
from skyjax.models.dropout import dropout
from skyjax.models.hf_loading import CheckpointError

FIXTURE = os.path.join(os.path.dirname(__file__), "fixtures", "tiny_bert")
SMALL = bert.BertConfig(vocab_size=64, hidden_size=32, num_hidden_layers=3, num_attention_heads=4,
                        intermediate_size=48, max_position_embeddings=32, num_labels=3,
                        hidden_dropout_prob=0.2, attention_probs_dropout_prob=0.3)


def padded_batch(batch=3, seq=12, vocab=64, seed=0):
    rng = np.random.default_rng(seed)
    ids = rng.integers(1, vocab, (batch, seq)).astype(np.int32)
    types = np.zeros_like(ids)
    types[:, seq // 2:] = 1
    mask = np.ones_like(ids)
    for b in range(1, batch):
        mask[b, seq - 2 * b - 1:] = 0
    return ids, types, mask


def test_fixture_logits_match_hugging_face_pytorch():
    ref = np.load(os.path.join(FIXTURE, "reference.npz"))
    model = bert.from_pretrained(FIXTURE)
    logits = model(ref["input_ids"], ref["token_type_ids"], ref["attention_mask"])
    assert logits.shape == ref["logits"].shape
    np.testing.assert_allclose(np.asarray(logits), ref["logits"], atol=1e-5, rtol=0)


@pytest.mark.parametrize("hidden_act", ["gelu", "gelu_new", "relu"])
def test_live_parity_with_fresh_hugging_face_weights(tmp_path, hidden_act):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(1)
    cfg = transformers.BertConfig(vocab_size=64, hidden_size=24, num_hidden_layers=2,
                                  num_attention_heads=3, intermediate_size=40,
                                  max_position_embeddings=40, num_labels=4, hidden_act=hidden_act)
    hf = transformers.BertForSequenceClassification(cfg).eval()
    with torch.no_grad():
        for p in hf.parameters():
            p.add_(0.3 * torch.randn_like(p))
    hf.save_pretrained(tmp_path, safe_serialization=True)
    ids, types, mask = padded_batch(4, 20, 64, seed=2)
    with torch.no_grad():
        want = hf(input_ids=torch.tensor(ids, dtype=torch.long),
                  token_type_ids=torch.tensor(types, dtype=torch.long),
                  attention_mask=torch.tensor(mask, dtype=torch.long)).logits.numpy()
    got = bert.from_pretrained(str(tmp_path))(ids, types, mask)
    np.testing.assert_allclose(np.asarray(got), want, atol=1e-5, rtol=0)


def test_bare_bert_model_gets_a_new_classifier(tmp_path):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(2)
    cfg = transformers.BertConfig(vocab_size=64, hidden_size=16, num_hidden_layers=1,
                                  num_attention_heads=2, intermediate_size=32,
                                  max_position_embeddings=32)
    hf = transformers.BertModel(cfg).eval()
    hf.save_pretrained(tmp_path, safe_serialization=True)
    model = bert.from_pretrained(str(tmp_path), num_labels=5)
    ids, types, mask = padded_batch(2, 10, 64)
    with torch.no_grad():
        pooled = hf(input_ids=torch.tensor(ids, dtype=torch.long),
                    token_type_ids=torch.tensor(types, dtype=torch.long),
                    attention_mask=torch.tensor(mask, dtype=torch.long)).pooler_output.numpy()
    classifier = model.head.classifier
    want = pooled @ np.asarray(classifier.kernel[...]) + np.asarray(classifier.bias[...])
    got = model(ids, types, mask)
    assert got.shape == (2, 5)
    np.testing.assert_allclose(np.asarray(got), want, atol=1e-5, rtol=0)


def _copy_fixture(tmp_path, edit_tensors=None):
    from safetensors.numpy import load_file, save_file

    tmp_path.mkdir()
    shutil.copy(os.path.join(FIXTURE, "config.json"), tmp_path / "config.json")
    tensors = load_file(os.path.join(FIXTURE, "model.safetensors"))
    if edit_tensors:
        edit_tensors(tensors)
    save_file(tensors, str(tmp_path / "model.safetensors"))
    return str(tmp_path)


def test_checkpoint_errors_name_the_file_or_tensor(tmp_path):
    with pytest.raises(CheckpointError, match="is not a directory with a config.json"):
        bert.from_pretrained(str(tmp_path))
    shutil.copy(os.path.join(FIXTURE, "config.json"), tmp_path / "config.json")
    with pytest.raises(CheckpointError, match="model.safetensors: file not found"):
        bert.from_pretrained(str(tmp_path))

    def unknown(t):
        t["bert.encoder.layer.0.attention.self.rotary.weight"] = np.zeros(3, np.float32)

    with pytest.raises(CheckpointError, match="rotary"):
        bert.from_pretrained(_copy_fixture(tmp_path / "a", unknown))

    def drop(t):
        del t["bert.encoder.layer.1.output.dense.weight"]

    with pytest.raises(CheckpointError, match=r"layers\.1\.output\.dense\.kernel"):
        bert.from_pretrained(_copy_fixture(tmp_path / "b", drop))

    def reshape(t):
        t["bert.pooler.dense.bias"] = np.zeros(7, np.float32)

    with pytest.raises(CheckpointError, match=r"bert\.pooler\.dense\.bias: shape \(7,\)"):
        bert.from_pretrained(_copy_fixture(tmp_path / "c", reshape))


def test_num_labels_mismatch_with_checkpoint_classifier_is_an_error():
    with pytest.raises(CheckpointError, match="classifier"):
        bert.from_pretrained(FIXTURE, num_labels=7)


def test_config_round_trips_and_validates():
    with open(os.path.join(FIXTURE, "config.json")) as f:
        hf = json.load(f)
    cfg = bert.BertConfig.from_hf(hf)
    assert cfg.num_labels == 3 and cfg.hidden_size == 32
    assert bert.BertConfig.from_hf(cfg.to_hf()) == cfg
    with pytest.raises(ValueError, match="num_attention_heads=5 does not divide hidden_size=32"):
        bert.BertConfig(hidden_size=32, num_attention_heads=5).validate()
    with pytest.raises(ValueError, match="hidden_act='swiglu'"):
        bert.BertConfig(hidden_act="swiglu").validate()


# ---------------------------------------------------------------------------------------------
# Units


@pytest.fixture(scope="module")
def small_model():
    return bert.BertForSequenceClassification(SMALL, nnx.Rngs(3))


def _full_loss(model_params, model, ids, types, mask, labels, rng, train):
    graphdef, state = nnx.split(model)
    rest = nnx.to_pure_dict(state)

    def loss(p):
        m = nnx.merge(graphdef, p)
        logits = m(ids, types, mask, train=train, rng=rng)
        return metrics.classification_loss(logits, labels)[0], logits

    return jax.value_and_grad(loss, has_aux=True)(rest)


def _units_loss(chain, ids, types, mask, labels, rng, train):
    def loss(params):
        carry = bert.apply_units(chain, params, bert.initial_carry(ids, types, mask), rng, train)
        return metrics.classification_loss(carry["logits"], labels)[0], carry["logits"]

    return jax.value_and_grad(loss, has_aux=True)([u.params for u in chain])


def _lookup(tree, path):
    for key in path:
        tree = tree[int(key) if isinstance(key, str) and key.isdigit() and int(key) in tree
                    else key]
    return tree


@pytest.mark.parametrize("granularity", ["layer", "sublayer"])
@pytest.mark.parametrize("train", [False, True])
def test_units_compose_to_full_model_logits_and_gradients(small_model, granularity, train):
    ids, types, mask = padded_batch(4, 16, SMALL.vocab_size, seed=5)
    labels = np.array([0, 1, 2, 1])
    rng = jax.random.key(11)
    (loss_f, logits_f), grads_f = _full_loss(None, small_model, ids, types, mask, labels, rng, train)
    chain = bert.units(small_model, granularity)
    (loss_u, logits_u), grads_u = _units_loss(chain, ids, types, mask, labels, rng, train)
    np.testing.assert_allclose(logits_u, logits_f, atol=1e-6, rtol=0)
    np.testing.assert_allclose(loss_u, loss_f, atol=1e-6, rtol=0)
    for unit, g in zip(chain, grads_u):
        want = _lookup(grads_f, unit.path)
        jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-6, rtol=0), g, want)
    if train:  # dropout is really on: the train logits differ from eval logits
        eval_logits = small_model(ids, types, mask)
        assert np.abs(np.asarray(eval_logits) - np.asarray(logits_f)).max() > 1e-3


@pytest.mark.slow
def test_granularities_give_identical_training_math(small_model):
    ids, types, mask = padded_batch(2, 10, SMALL.vocab_size, seed=7)
    rng = jax.random.key(3)
    outs = []
    for g in ("layer", "sublayer"):
        chain = bert.units(small_model, g)
        carry = bert.initial_carry(ids, types, mask)
        for unit in chain:  # each unit jitted on its own, as a pipeline stage would
            carry = jax.jit(unit.apply, static_argnames="train")(unit.params, carry, rng, train=True)
        outs.append(np.asarray(carry["logits"]))
    np.testing.assert_allclose(outs[0], outs[1], atol=1e-6, rtol=0)


def test_unit_chain_shape(small_model):
    layer = bert.units(small_model, "layer")
    sub = bert.units(small_model, "sublayer")
    assert [u.name for u in layer] == ["embeddings", "layer_0", "layer_1", "layer_2", "head"]
    assert len(sub) == 3 * SMALL.num_hidden_layers + 2
    assert [u.kind for u in sub[1:4]] == ["attention", "intermediate", "output"]
    with pytest.raises(ValueError, match="granularity='block'"):
        bert.units(small_model, "block")


def test_training_dropout_needs_a_key_and_eval_ignores_it(small_model):
    ids, types, mask = padded_batch(2, 8, SMALL.vocab_size)
    a = small_model(ids, types, mask, rng=jax.random.key(0))
    b = small_model(ids, types, mask, rng=jax.random.key(1))
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    with pytest.raises(ValueError, match="rng"):
        small_model(ids, types, mask, train=True)


def test_padding_tokens_do_not_change_logits(small_model):
    ids, types, mask = padded_batch(1, 12, SMALL.vocab_size)
    mask[0, 8:] = 0
    other = ids.copy()
    other[0, 8:] = 1 + (other[0, 8:] % 50)
    a = small_model(ids, types, mask)
    b = small_model(jnp.asarray(other), types, mask)
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-6)


def _residuals(f, *args):
    """The arrays ``jax.vjp`` keeps for the backward of ``f`` at ``args``, and the pullback."""
    _, pullback = jax.vjp(f, *args)
    return jax.tree.leaves(pullback), pullback


@pytest.mark.parametrize("hidden_act", ["gelu", "relu"])
def test_feed_forward_keeps_one_wide_array_and_plain_autodiffs_gradients(hidden_act):
    """The rematerialised feed-forward block keeps one ``[.., intermediate_size]`` activation
    (the activation's input), and its float32 gradients are plain autodiff's to float32's
    rounding (the sums over tokens may be fused in another order)."""
    layer = modeling.BertLayer(dataclasses.replace(SMALL, hidden_act=hidden_act), nnx.Rngs(2))
    graphdef, state = nnx.split((layer.intermediate, layer.output.dense))
    act = modeling.ACTIVATIONS[hidden_act]
    x = jax.random.normal(jax.random.key(0), (3, 12, SMALL.hidden_size))

    def remat(s, v):
        inner, out = nnx.merge(graphdef, s)
        return modeling.feed_forward(inner, out, v)

    def plain(s, v):
        inner, out = nnx.merge(graphdef, s)
        return out(act(inner.dense(v)))

    wide = lambda leaves: [r for r in leaves if r.shape == (3, 12, SMALL.intermediate_size)]  # noqa: E731
    kept, pullback = _residuals(remat, state, x)
    kept_plain, pullback_plain = _residuals(plain, state, x)
    assert len(wide(kept)) == 1
    assert len(wide(kept_plain)) > 1 if hidden_act == "gelu" else len(wide(kept_plain)) >= 1
    cotangent = jnp.cos(jnp.arange(3 * 12 * SMALL.hidden_size, dtype=jnp.float32)
                        ).reshape(3, 12, SMALL.hidden_size)
    got, want = jax.jit(pullback)(cotangent), jax.jit(pullback_plain)(cotangent)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6), got, want)


def test_dropout_keeps_only_its_mask_and_plain_autodiffs_gradient():
    x = jax.random.normal(jax.random.key(1), (4, 8, 16))
    keys = bert.example_keys(0, 0, 0, 4)
    kept, pullback = _residuals(lambda v: dropout(v, 0.25, keys, True), x)
    assert [r.dtype for r in kept if r.shape == x.shape] == [jnp.bool_]  # no zero array
    keep = next(r for r in kept if r.shape == x.shape)
    plain = lambda v: jnp.where(keep, v / 0.75, jnp.zeros_like(v))  # noqa: E731
    np.testing.assert_array_equal(np.asarray(dropout(x, 0.25, keys, True)),
                                  np.asarray(plain(x)))
    cotangent = jnp.sin(jnp.arange(x.size, dtype=jnp.float32)).reshape(x.shape)
    np.testing.assert_array_equal(np.asarray(jax.jit(pullback)(cotangent)[0]),
                                  np.asarray(jax.vjp(plain, x)[1](cotangent)[0]))
    assert 0.6 < float(jnp.mean(keep)) < 0.9


def test_bf16_attention_keeps_its_scores_and_mask_and_recomputes_the_softmax():
    cfg = dataclasses.replace(SMALL, compute_dtype="bfloat16")
    unit = bert.units(bert.BertForSequenceClassification(cfg, nnx.Rngs(4)), "layer")[1]
    ids, types, mask = padded_batch(3, 12, SMALL.vocab_size)
    carry = {"hidden": jax.random.normal(jax.random.key(2), (3, 12, SMALL.hidden_size),
                                         jnp.bfloat16), "attention_mask": jnp.asarray(mask)}
    keys = bert.example_keys(0, 0, 0, 3)
    kept, _ = _residuals(lambda p, c: unit.apply(p, c, keys, True)["hidden"], unit.params, carry)
    planes = sorted(str(r.dtype) for r in kept if r.shape == (3, SMALL.num_attention_heads, 12, 12))
    assert planes == ["bool", "float32"]  # the scores and the mask: no exponentials, no probs

    # the rematerialised attention is the plain one to bf16's rounding
    q, k, v = (jax.random.normal(jax.random.key(i), (3, 12, 4, 8), jnp.bfloat16) for i in (5, 6, 7))
    scores = jnp.einsum("bqhd,bkhd->bhqk", q, k, preferred_element_type=jnp.float32)
    attend = functools.partial(modeling.attend, 8, 0.3, True)
    remat = jax.checkpoint(attend, policy=modeling.KEEP_DROPOUT_MASKS)
    cotangent = jnp.cos(jnp.arange(3 * 12 * 4 * 8, dtype=jnp.float32)).reshape(3, 12, 4, 8)
    grads = [jax.vjp(lambda s, vv: f(s, jnp.asarray(mask), vv, keys), scores, v)[1](
        cotangent.astype(jnp.bfloat16)) for f in (attend, remat)]
    for plain, rematerialised in zip(*grads):
        np.testing.assert_allclose(np.asarray(rematerialised, np.float32),
                                   np.asarray(plain, np.float32), rtol=2e-2, atol=2e-2)
