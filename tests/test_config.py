"""Config files and validate_config: every config loads and validates; bad ones fail by key."""

from __future__ import annotations

import glob
import os
import textwrap

import ml_collections
import pytest
from ml_collections import config_flags
from absl import flags

from skyjax.config import defaults as config_defaults
from skyjax.config.defaults import planned_pipelines
from skyjax.config import validate_config

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIG_FILES = sorted(f for f in glob.glob(os.path.join(REPO, "configs", "*.py"))
                      if not f.endswith("__init__.py"))


def load(path: str, *overrides: str) -> ml_collections.ConfigDict:
    """Loads a config file the way ``skyjax.main`` does (config_flags, locked), with overrides."""
    argv = ["prog", f"--config={path}", *overrides]
    fv = flags.FlagValues()
    config_flags.DEFINE_config_file("config", None, "", flag_values=fv, lock_config=True,
                                    sys_argv=argv)
    fv(argv)
    return fv.config


def demo(*overrides: str) -> ml_collections.ConfigDict:
    return load(os.path.join(REPO, "configs", "local_demo.py"), *overrides)


@pytest.mark.parametrize("path", CONFIG_FILES, ids=os.path.basename)
def test_config_files_validate(path):
    config = load(path)
    validate_config(config)
    assert config.is_locked


def test_required_config_files_exist():
    names = {os.path.basename(p) for p in CONFIG_FILES}
    assert {"local_demo.py", "local_hetero.py", "bert_base_mnli.py", "bert_large_mnli.py",
            "sky160.py"} <= names


def test_stable_keys():
    config = demo()
    assert config.train.steps > 0 and isinstance(config.train.seed, int)
    assert config.pipeline.schedule in ("gpipe", "1f1b")
    assert config.pipeline.microbatches >= 1
    assert config.allocation.strategy in ("even", "optimal", "dynamic")
    assert config.allocation.granularity in ("layer", "sublayer")
    assert config.cluster.mode in ("local", "distributed")
    assert len(config.cluster.slowdowns) == config.cluster.num_devices


# what configs/local_demo.py changes of the defaults (skyjax/config/defaults.py says so)
DEMO_CHANGES = {("cluster", "num_devices"), ("cluster", "slowdowns"),
                ("pipeline", "microbatches"), ("allocation", "calibrate_steps")}


def test_demo_defaults_equal_base_config_but_the_cluster():
    """The defaults are the demo's but for its emulated devices, micro-batches and calibration:
    the demo times the even split over 4 devices of unequal speed, then the chosen plan."""
    ours, base = demo().to_dict(), config_defaults.base_config().to_dict()
    changed = {(group, key) for group in base for key in base[group]
               if ours[group][key] != base[group][key]}
    assert changed == DEMO_CHANGES
    assert base["cluster"]["num_devices"] == 1 and ours["cluster"]["num_devices"] == 4
    assert len(set(ours["cluster"]["slowdowns"])) > 1  # unequal speeds
    assert 2 <= ours["allocation"]["calibrate_steps"] < ours["train"]["steps"]
    assert ours["allocation"]["strategy"] == "optimal"


def test_local_hetero():
    config = load(os.path.join(REPO, "configs", "local_hetero.py"))
    assert config.cluster.mode == "distributed"
    assert config.cluster.num_devices == 4
    assert tuple(config.cluster.slowdowns) == (1, 2, 3, 6)
    assert 2 <= config.allocation.calibrate_steps < config.train.steps  # see the config's note
    assert config.profile.passes > 1  # four devices on two shared cores: skyjax/hostmodel/passes.py
    assert config.model.to_dict() == demo().model.to_dict()


@pytest.mark.parametrize("name,overrides", [
    ("local_hetero.py", {"allocation.strategy": "even"}),
    ("local_demo.py", {"allocation.strategy": "even"}),
    ("local_demo.py", {"train.steps": 4}),
])
def test_shipped_configs_take_the_documented_overrides(name, overrides):
    """Calibration has nothing to do on the even split or with too few steps: it is skipped
    (logged), not refused, so the shipped configs take the guides' overrides (docs/guide/)."""
    from skyjax.train import calibration_steps

    config = load(os.path.join(REPO, "configs", name))
    for key, value in overrides.items():
        group, field = key.split(".")
        config[group][field] = value
    validate_config(config)
    assert config.allocation.calibrate_steps > 0 and calibration_steps(config, 0) == 0


def test_auto_pipelines_is_the_default_and_one_where_several_are_not_planned():
    """max_pipelines 0 (auto) is accepted with calibration, the shared-host model and the
    other strategies, where the planner gets 1; an explicit N > 1 there is still refused."""
    assert config_defaults.base_config().allocation.max_pipelines == 0
    config = demo()  # calibrates on the even split
    validate_config(config)
    assert config.allocation.max_pipelines == 0 and planned_pipelines(config) == 1
    for key, value in [("calibrate_steps", 0), ("strategy", "dynamic"), ("strategy", "even")]:
        variant = demo()
        variant.unlock()
        variant.allocation.calibrate_steps = 0
        variant.allocation[key] = value
        validate_config(variant)
        assert planned_pipelines(variant) == (0 if variant.allocation.strategy == "optimal" else 1)
    hetero = load(os.path.join(REPO, "configs", "local_hetero.py"))  # shared host, calibrates
    hetero.unlock()
    hetero.allocation.calibrate_steps = 0
    validate_config(hetero)
    assert planned_pipelines(hetero) == 1
    hetero.allocation.max_pipelines = 2
    with pytest.raises(ValueError, match="shared_host=True"):
        validate_config(hetero)


def test_sky160_shape():
    config = load(os.path.join(REPO, "configs", "sky160.py"))
    assert config.model.num_hidden_layers == 160 and config.model.hidden_size == 1024
    assert config.allocation.granularity == "sublayer"
    assert len(config.cluster.slowdowns) == config.cluster.num_devices
    assert set(config.cluster.slowdowns) <= set(range(1, 7))


def test_tuple_override_from_command_line():
    config = load(os.path.join(REPO, "configs", "local_hetero.py"),
                  "--config.cluster.slowdowns=(1, 3, 2, 1.5)")
    assert tuple(config.cluster.slowdowns) == (1, 3, 2, 1.5)
    validate_config(config)


@pytest.mark.parametrize("override, message", [
    ("--config.model.num_attention_heads=3",
     "config.model.num_attention_heads=3 does not divide config.model.hidden_size=128"),
    ("--config.data.seq_len=65", "config.data.seq_len=65 is above "
                                 "config.model.max_position_embeddings=64"),
    ("--config.pipeline.microbatches=5",
     "config.pipeline.microbatches=5 does not divide config.data.batch_size=32"),
    ("--config.pipeline.schedule=pipedream", "config.pipeline.schedule='pipedream'"),
    ("--config.pipeline.sync_actions=sometimes", "config.pipeline.sync_actions='sometimes'"),
    ("--config.allocation.strategy=greedy", "config.allocation.strategy='greedy'"),
    ("--config.allocation.granularity=block", "config.allocation.granularity='block'"),
    ("--config.cluster.mode=cloud", "config.cluster.mode='cloud'"),
    ("--config.model.hidden_act=swiglu", "config.model.hidden_act='swiglu'"),
    ("--config.train.learning_rate=-0.1", "config.train.learning_rate=-0.1 must be > 0"),
    ("--config.train.steps=0", "config.train.steps=0"),
    ("--config.cluster.slowdowns=(0.5, 1, 1, 1)",
     "config.cluster.slowdowns[0]=0.5 must be >= 1"),
    ("--config.cluster.slowdowns=(1, 2)", "config.cluster.slowdowns has 2 entries but "
                                          "config.cluster.num_devices=4"),
    # not a Python literal: config_flags keeps the text as one entry, which is not "1 entries"
    ("--config.cluster.slowdowns=(1,nan)",
     "config.cluster.slowdowns: 'nan' in '(1,nan)' is not a finite number"),
    ("--config.cluster.memory_caps_bytes=(0, 0, lots, 0)",
     "config.cluster.memory_caps_bytes: 'lots' in '(0, 0, lots, 0)' is not a finite number"),
    ("--config.cluster.regions=('eu', 'us')", "config.cluster.regions has 2 entries"),
    ("--config.cluster.memory_caps_bytes=(-1, 0, 0, 0)",
     "config.cluster.memory_caps_bytes[0]=-1"),
    ("--config.cluster.coordinator_address=localhost", "config.cluster.coordinator_address"),
    ("--config.cluster.transfer_host=10.0.0.1:4000", "config.cluster.transfer_host="),
    ("--config.cluster.transfer_ports=40000:40100", "config.cluster.transfer_ports='40000:40100' "
                                                    "must be 'FIRST-LAST'"),
    ("--config.cluster.transfer_ports=40100-40000", "config.cluster.transfer_ports='40100-40000'"),
    ("--config.cluster.transfer_ports=0-10", "config.cluster.transfer_ports='0-10'"),
    ("--config.cluster.transfer_chunk_bytes=1024", "config.cluster.transfer_chunk_bytes=1024"),
    ("--config.cluster.transfer_parallel_copies=0", "config.cluster.transfer_parallel_copies=0"),
    ("--config.model.hidden_dropout_prob=1.0", "config.model.hidden_dropout_prob=1.0"),
    ("--config.model.num_labels=2", "config.model.num_labels=2 but the synthetic task has 3"),
    ("--config.model.vocab_size=4", "config.model.vocab_size=4"),
    ("--config.data.seq_len=8", "config.data.seq_len=8 is below 11"),
    ("--config.data.name=imagenet", "config.data.name='imagenet'"),
    ("--config.allocation.replan_every=10", "config.allocation.replan_every=10 needs"),
    ("--config.allocation.calibrate_steps=1", "config.allocation.calibrate_steps=1: the first"),
    ("--config.allocation.calibrate_steps=-2", "config.allocation.calibrate_steps=-2"),
    ("--config.allocation.max_pipelines=-1", "config.allocation.max_pipelines=-1"),
    ("--config.allocation.max_pipelines=64", "config.allocation.max_pipelines=64 exceeds"),
    ("--config.model.pretrained=/nonexistent", "config.model.pretrained='/nonexistent'"),
    ("--config.profile.repeats=0", "config.profile.repeats=0"),
    ("--config.profile.passes=0", "config.profile.passes=0"),
    ("--config.relax.handoff_bits=5", "config.relax.handoff_bits=5"),
    ("--config.relax.averaging=topk", "config.relax.averaging='topk'"),
    ("--config.relax.outer_every=0", "config.relax.outer_every=0"),
    ("--config.relax.outer_momentum=1.0", "config.relax.outer_momentum=1.0"),
    # the demo calibrates on the even split: a relaxation is the planner's choice, made once
    ("--config.relax.handoff_bits=8", "config.relax (handoff_bits=8, averaging='exact') needs"),
])
def test_bad_values_name_the_key(override, message):
    config = demo(override)
    with pytest.raises(ValueError) as info:
        validate_config(config)
    assert message in str(info.value)


def test_transfer_server_keys_take_good_values_and_check_the_ports_variable(monkeypatch):
    """A host name, an IPv6 address and a port range pass; with the key empty a malformed
    $SKYJAX_TRANSFER_PORTS is refused naming the variable (the key wins when set)."""
    for host, ports in (("node7-ib", "40000-40100"), ("fd00::7", "40000"), ("", "")):
        validate_config(demo(f"--config.cluster.transfer_host={host}",
                             f"--config.cluster.transfer_ports={ports}"))
    monkeypatch.setenv("SKYJAX_TRANSFER_PORTS", "many")
    with pytest.raises(ValueError, match=r"\$SKYJAX_TRANSFER_PORTS='many'"):
        validate_config(demo())
    validate_config(demo("--config.cluster.transfer_ports=40000-40001"))


def test_unknown_key_on_command_line_is_rejected():
    with pytest.raises((AttributeError, KeyError, flags.Error)):
        demo("--config.model.hidden=64")


def test_config_file_with_unknown_key(tmp_path):
    path = tmp_path / "extra.py"
    path.write_text(textwrap.dedent("""
        from skyjax.config import base_config

        def get_config():
            config = base_config()
            config.train.warmup = 10  # a typo of warmup_steps
            return config
    """))
    with pytest.raises(ValueError, match=r"config\.train\.warmup: unknown config key"):
        validate_config(load(str(path)))


@pytest.mark.parametrize("returns, what", [("None", "None"), ("{'train': {'steps': 3}}", "a dict"),
                                           ("5", "an int")])
@pytest.mark.parametrize("override", [[], ["--config.train.steps=3"]])
def test_a_config_file_returning_no_config_is_one_line_naming_it(tmp_path, returns, what,
                                                                  override):
    """absl would say '--config must have a value other than None', config_flags that None has
    no attribute 'train', validation that a dict misses 'config.allocation'."""
    from skyjax.names import EXIT_BAD_INPUT
    from tests.helpers import run_module

    path = tmp_path / "mine.py"
    path.write_text(f"def get_config():\n    return {returns}\n")
    proc = run_module("skyjax.main", f"--config={path}", f"--workdir={tmp_path / 'run'}",
                      *override, timeout=120)
    assert proc.returncode == EXIT_BAD_INPUT, proc.stderr[-2000:]
    assert proc.stderr.strip().splitlines() == [
        f"Invalid config: --config {path}: get_config() returned {what}, not an "
        "ml_collections.ConfigDict (return skyjax.config.base_config() with your changes)"]


def test_config_file_with_missing_key():
    config = config_defaults.base_config()
    del config.train["eval_every"]
    with pytest.raises(ValueError, match=r"config\.train\.eval_every: missing config key"):
        validate_config(config)


def test_wrong_types_name_the_key():
    raw = config_defaults.base_config().to_dict()
    raw["train"]["steps"] = "100"
    with pytest.raises(ValueError, match=r"config\.train\.steps='100' has type str"):
        validate_config(ml_collections.ConfigDict(raw))
    raw = config_defaults.base_config().to_dict()
    raw["cluster"]["slowdowns"] = 2
    with pytest.raises(ValueError, match=r"config\.cluster\.slowdowns=2 has type int"):
        validate_config(ml_collections.ConfigDict(raw))
    raw = config_defaults.base_config().to_dict()
    raw["profile"]["reprofile"] = 1
    with pytest.raises(ValueError, match=r"config\.profile\.reprofile=1 has type int"):
        validate_config(ml_collections.ConfigDict(raw))


def test_pretrained_directory_is_accepted(tmp_path):
    (tmp_path / "config.json").write_text('{"max_position_embeddings": 16}')
    config = demo(f"--config.model.pretrained={tmp_path}", "--config.data.seq_len=16")
    validate_config(config)
    config = demo(f"--config.model.pretrained={tmp_path}")
    with pytest.raises(ValueError, match="config.data.seq_len=32 is above"):
        validate_config(config)


def test_glue_without_tokenizer_fails_only_when_built():
    from skyjax import data

    config = load(os.path.join(REPO, "configs", "bert_base_mnli.py"))
    validate_config(config)  # loading and validating are fine
    with pytest.raises(ValueError, match="config.data.name='glue/mnli'"):
        data.train_batches(config)  # no config.data.tokenizer nor config.model.pretrained


def test_hidden_acts_match_the_model():
    from skyjax.models import bert

    assert set(config_defaults.HIDDEN_ACTS) == set(bert.ACTIVATIONS)


def test_config_to_model_config():
    from skyjax.models.build import model_config

    config = demo("--config.model.hidden_act=relu", "--config.model.num_hidden_layers=2")
    bert_config = model_config(config.model)
    assert bert_config.hidden_act == "relu" and bert_config.num_hidden_layers == 2
    decoder_keys = {"model_type", "num_key_value_heads", "tie_word_embeddings", "rope_theta"}
    for key, value in config.model.items():
        if key != "pretrained" and key not in decoder_keys:
            assert getattr(bert_config, key) == value, key


def test_the_warmup_key_takes_1f1b_or_auto():
    """config.pipeline.warmup takes "1f1b" / "auto" and refuses others naming the key."""
    validate_config(demo("--config.pipeline.warmup=auto"))
    with pytest.raises(ValueError, match="config.pipeline.warmup='deep'"):
        validate_config(demo("--config.pipeline.warmup=deep"))


@pytest.mark.parametrize("overrides,message", [
    (["--config.data.name=synthetic"], "config.data.name='synthetic': a gpt2 language model "
                                       "trains on text"),
    (["--config.data.metric=accuracy"], "a gpt2 language model is scored by perplexity"),
    (["--config.model.model_type=gpt3"], "config.model.model_type='gpt3'"),
    (["--config.model.num_key_value_heads=3"], "num_key_value_heads=3 does not divide"),
    (["--config.data.eval_fraction=1.0"], r"config.data.eval_fraction=1.0 must be in \[0, 1\)"),
    (["--config.data.txt_documents=line"], "config.data.txt_documents"),
    (["--config.data.seq_len=80"], "config.data.seq_len=80 is above the model's 64 positions"),
])
def test_a_language_models_config_is_refused_by_key(overrides, message):
    config = load(os.path.join(REPO, "configs", "gpt2_text.py"), *overrides)
    with pytest.raises(ValueError, match=message):
        validate_config(config)


def test_a_language_model_metric_is_refused_for_bert():
    with pytest.raises(ValueError, match="config.data.metric='perplexity' is a language model's"):
        validate_config(demo("--config.data.metric=perplexity"))
