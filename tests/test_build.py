"""Per-unit model building (skyjax/models/build.py): a process makes only the units it owns, and
each unit's parameters equal those of the whole model however the units are chosen — random init
keyed by block position, or read from the safetensors tensor by tensor."""

from __future__ import annotations

import json
import os
import shutil

import jax
import numpy as np
import pytest

from skyjax.config import base_config
from skyjax.models import build, hf_loading, units

FIXTURE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures", "tiny_bert")


def model_cfg(pretrained: str = ""):
    config = base_config()
    m = config.model
    m.hidden_size, m.num_hidden_layers, m.num_attention_heads, m.intermediate_size = 32, 3, 2, 48
    m.pretrained = pretrained
    return m


def assert_same(a, b):
    assert jax.tree.structure(a) == jax.tree.structure(b)
    jax.tree.map(np.testing.assert_array_equal, a, b)


def bare_checkpoint(tmp_path) -> str:
    """The fixture without its classifier (a pre-trained BertModel)."""
    from safetensors.numpy import load_file, save_file

    out = tmp_path / "bare"
    shutil.copytree(FIXTURE, out)
    tensors = {k: v for k, v in load_file(str(out / "model.safetensors")).items()
               if not k.startswith("classifier.")}
    save_file(tensors, str(out / "model.safetensors"))
    return str(out)


@pytest.mark.parametrize("granularity", ["layer", "sublayer"])
@pytest.mark.parametrize("source", ["random", "pretrained", "bare"])
def test_any_subset_of_units_equals_the_whole_model(granularity, source, tmp_path):
    pretrained = {"random": "", "pretrained": FIXTURE, "bare": None}[source]
    if pretrained is None:
        pretrained = bare_checkpoint(tmp_path)
    cfg = model_cfg(pretrained)
    if pretrained:
        cfg.num_labels = 3
    seed = 11
    whole = units.units(build.build_model(cfg, seed), granularity)
    chain = build.abstract_chain(cfg, seed, granularity)
    assert not any(build.is_materialized(u) for u in chain)
    n = len(chain)
    for subset in ([n - 1], [0, 1], list(range(2, n))):  # head alone, embeddings + 1, the rest
        made = build.materialize(build.UnitInitializer(cfg, seed), chain, subset)
        assert [build.is_materialized(u) for u in made] == [i in subset for i in range(n)]
        for i in subset:
            assert_same(made[i].params, whole[i].params)


def test_random_init_depends_on_the_seed_and_block_not_on_order():
    cfg = model_cfg()
    chain = build.abstract_chain(cfg, 0, "layer")
    a = build.materialize(build.UnitInitializer(cfg, 0), chain, [2])[2].params
    b = build.materialize(build.UnitInitializer(cfg, 0), chain, [3, 2, 1])[2].params
    c = build.materialize(build.UnitInitializer(cfg, 1), chain, [2])[2].params
    other_layer = build.materialize(build.UnitInitializer(cfg, 0), chain, [1])[1].params
    assert_same(a, b)
    kernel = lambda p: np.asarray(p["intermediate"]["dense"]["kernel"])  # noqa: E731
    assert not np.array_equal(kernel(a), kernel(c))
    assert not np.array_equal(kernel(a), kernel(other_layer))


def test_a_unit_reads_only_its_own_tensors(monkeypatch):
    cfg = model_cfg(FIXTURE)
    cfg.num_labels = 3
    read: list[str] = []
    original = hf_loading.SafetensorsCheckpoint.read
    monkeypatch.setattr(hf_loading.SafetensorsCheckpoint, "read",
                        lambda self, name: read.append(name) or original(self, name))
    init = build.UnitInitializer(cfg, 0)  # headers only
    assert read == []
    chain = build.abstract_chain(cfg, 0, "sublayer")
    build.materialize(init, chain, [4])  # layer_1.attention
    assert read and all(name.startswith("bert.encoder.layer.1.attention.") for name in read)
    assert len(read) == 10  # q, k, v, output dense (weight + bias each), LayerNorm (2)


def test_bad_checkpoint_fails_when_the_initializer_is_built(tmp_path):
    """Header checks (names and shapes) come before any parameter is read or compiled."""
    from safetensors.numpy import load_file, save_file

    out = tmp_path / "bad"
    shutil.copytree(FIXTURE, out)
    tensors = load_file(str(out / "model.safetensors"))
    name = "bert.encoder.layer.1.output.dense.weight"
    tensors[name] = tensors[name][:, :-1]
    save_file(tensors, str(out / "model.safetensors"))
    cfg = model_cfg(str(out))
    cfg.num_labels = 3
    with pytest.raises(hf_loading.CheckpointError, match=f"tensor {name}: shape"):
        build.UnitInitializer(cfg, 0)


def test_sharded_checkpoint_is_read_through_its_index(tmp_path):
    from safetensors.numpy import load_file, save_file

    out = tmp_path / "sharded"
    out.mkdir()
    shutil.copy(os.path.join(FIXTURE, "config.json"), out)
    tensors = load_file(os.path.join(FIXTURE, "model.safetensors"))
    names = sorted(tensors)
    shards = {"model-00001-of-00002.safetensors": names[::2],
              "model-00002-of-00002.safetensors": names[1::2]}
    for file, part in shards.items():
        save_file({k: tensors[k] for k in part}, str(out / file))
    (out / "model.safetensors.index.json").write_text(json.dumps(
        {"weight_map": {k: f for f, part in shards.items() for k in part}}))
    cfg, ref = model_cfg(str(out)), model_cfg(FIXTURE)
    cfg.num_labels = ref.num_labels = 3
    chain = build.abstract_chain(cfg, 0, "layer")
    got = build.materialize(build.UnitInitializer(cfg, 0), chain, range(len(chain)))
    want = build.materialize(build.UnitInitializer(ref, 0), chain, range(len(chain)))
    for a, b in zip(got, want):
        assert_same(a.params, b.params)
