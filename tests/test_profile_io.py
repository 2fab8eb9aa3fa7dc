"""profile.json: validation names the field; round trip keeps unknown keys; atomic save."""

from __future__ import annotations

import copy
import json
import math
import os
import re

import numpy as np
import pytest

from skyjax.profile.format import Profile, ProfileError, load_profile, save_profile


def good() -> dict:
    return {
        "version": 1, "microbatch": {"size": 8, "seq_len": 128},
        "units": [{"name": f"u{i}", "state_bytes": 10 * i, "activation_bytes": 2,
                   "output_bytes": 4} for i in range(3)],
        "devices": [{"name": "proc0:cpu0", "memory_bytes": 1000, "region": "eu"},
                    {"name": "proc1:cpu0", "memory_bytes": 2000}],
        "forward_s": [[0.1, 0.2], [0.1, 0.2], [0.3, 0.6]],
        "backward_s": [[0.2, 0.4], [0.2, 0.4], [0.6, 1.2]],
        "links": {"latency_s": [[0.0, 1e-3], [1e-3, 0.0]],
                  "bandwidth_Bps": [[1e12, 1e9], [1e9, 1e12]], "probe": "ping"},
        "measured_on": "2026-01-01",
    }


def test_roundtrip_keeps_unknown_keys(tmp_path):
    p = Profile.from_json(good())
    assert (p.num_units, p.num_devices) == (3, 2)
    assert p.forward_s.shape == (3, 2) and p.forward_s.dtype == np.float64
    assert p.extra["measured_on"] == "2026-01-01"
    assert p.devices[0]["region"] == "eu"
    want = json.loads(json.dumps(good()))
    # a version 1 file comes back as version 2 with zero fixed costs (same meaning)
    want.update(version=2, update_s=[[0.0, 0.0]] * 3, overheads={
        "forward_call_s": [0.0, 0.0], "backward_call_s": [0.0, 0.0],
        "update_call_s": [0.0, 0.0], "message_s": [0.0, 0.0], "input_s": [0.0, 0.0],
        "sync_s": 0.0})
    assert p.to_json() == want
    path = tmp_path / "profile.json"
    save_profile(p, str(path))
    assert load_profile(str(path)).to_json() == p.to_json()
    assert os.listdir(tmp_path) == ["profile.json"]  # no temporary files left


def test_the_w_times_round_trip_and_are_optional():
    """``backward_weight_s`` (zero-bubble W per unit and device) is read into its field and
    written back as given; a file without it reads as None (the planner's fallback)."""
    d = good()
    d["backward_weight_s"] = [[0.1, 0.25], [0.1, 0.2], [0.3, 0.5]]
    p = Profile.from_json(d)
    np.testing.assert_array_equal(p.backward_weight_s, d["backward_weight_s"])
    assert "backward_weight_s" not in p.extra
    assert Profile.from_json(json.loads(json.dumps(p.to_json()))).to_json() == p.to_json()
    assert p.to_json()["backward_weight_s"] == d["backward_weight_s"]
    bare = Profile.from_json(good())
    assert bare.backward_weight_s is None and "backward_weight_s" not in bare.to_json()


def test_infinite_bandwidth_allowed():
    d = good()
    d["links"]["bandwidth_Bps"][0][1] = math.inf
    assert Profile.from_json(d).bandwidth_Bps[0, 1] == math.inf


def _edit(path: str, value):
    d = good()
    keys = path.split("/")
    node = d
    for k in keys[:-1]:
        node = node[int(k)] if isinstance(node, list) else node[k]
    last = keys[-1]
    if value is KeyError:
        del node[last]
    elif isinstance(node, list):
        node[int(last)] = value
    else:
        node[last] = value
    return d


@pytest.mark.parametrize("path,value,msg", [
    ("version", 3, r"profile\.version: unsupported version 3"),
    ("overheads", {"message_s": [0.0]}, r"profile\.overheads\.message_s: expected 2 entries"),
    ("overheads", {"sync_s": -1}, r"profile\.overheads\.sync_s: negative"),
    ("update_s", [[0.0, 0.0]] * 2, r"profile\.update_s: expected 3 rows"),
    ("version", KeyError, r"profile\.version: missing"),
    ("units/1/state_bytes", KeyError, r"profile\.units\[1\]\.state_bytes: missing"),
    ("units/2/output_bytes", -1, r"profile\.units\[2\]\.output_bytes: negative"),
    ("devices/1/memory_bytes", "lots", r"profile\.devices\[1\]\.memory_bytes: expected a number"),
    ("devices/0/name", KeyError, r"profile\.devices\[0\]\.name: missing"),
    ("forward_s/1", [0.1], r"profile\.forward_s\[1\]: expected 2 columns"),
    ("backward_s", [[0.2, 0.4], [0.2, 0.4]], r"profile\.backward_s: expected 3 rows"),
    ("forward_s/2/1", -0.2, r"profile\.forward_s\[2\]\[1\]: negative time -0\.2"),
    ("backward_s/0/0", math.nan, r"profile\.backward_s\[0\]\[0\]: not a finite number"),
    ("forward_s/0/0", math.inf, r"profile\.forward_s\[0\]\[0\]: not a finite number"),
    ("forward_s/0/0", True, r"profile\.forward_s\[0\]\[0\]: expected a number"),
    ("links/latency_s/1", [0.0, 0.0, 0.0], r"profile\.links\.latency_s\[1\]: expected 2 columns"),
    ("links/bandwidth_Bps/0/1", -5, r"profile\.links\.bandwidth_Bps\[0\]\[1\]: negative"),
    ("links/latency_s", KeyError, r"profile\.links\.latency_s: missing"),
    ("microbatch/size", 0, r"profile\.microbatch\.size: expected a positive integer"),
    ("units", [], r"profile\.units: empty"),
    ("backward_weight_s", [[0.1, 0.2], [0.1, 0.2], [0.3, -0.6]],
     r"profile\.backward_weight_s\[2\]\[1\]: negative time -0\.6"),
    ("backward_weight_s", [[0.1, 0.2]] * 2, r"profile\.backward_weight_s: expected 3 rows"),
    ("backward_weight_s", [[0.1], [0.1], [0.3]],
     r"profile\.backward_weight_s\[0\]: expected 2 columns"),
    ("backward_weight_s", "half", r"profile\.backward_weight_s: expected a list"),
])
def test_bad_field_named(path, value, msg):
    d = _edit(path, value)
    with pytest.raises(ProfileError, match=msg):
        Profile.from_json(d)


def test_not_an_object():
    with pytest.raises(ProfileError, match="expected a JSON object"):
        Profile.from_json([1, 2])


def test_load_errors(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ProfileError, match="not valid JSON"):
        load_profile(str(bad))
    with pytest.raises(ProfileError, match="cannot read"):
        load_profile(str(tmp_path / "missing.json"))
    nan = tmp_path / "nan.json"
    d = good()
    d["forward_s"][1][0] = float("nan")
    nan.write_text(json.dumps(d))  # Python writes NaN, which json.load reads back
    with pytest.raises(ProfileError, match=r"forward_s\[1\]\[0\]"):
        load_profile(str(nan))


def test_from_json_does_not_alias_input():
    d = good()
    p = Profile.from_json(d)
    d2 = copy.deepcopy(d)
    p.devices[0]["name"] = "changed"
    assert d == d2


# --------------------------------------------------------------------------------------------
# The model record: what a profile was measured for.

RECORD = {"vocab_size": 30522, "hidden_size": 64, "num_hidden_layers": 2,
          "num_attention_heads": 2, "intermediate_size": 256, "max_position_embeddings": 512,
          "type_vocab_size": 2, "hidden_act": "gelu", "attention": "exact",
          "compute_dtype": "float32", "granularity": "layer"}


def test_the_model_record_round_trips_and_is_checked():
    d = dict(good(), model=dict(RECORD, newer_key=[1]))
    p = Profile.from_json(d)
    assert p.model == dict(RECORD, newer_key=[1]) and "model" not in p.extra
    assert p.to_json()["model"] == d["model"]  # unknown keys of the record kept
    assert Profile.from_json(good()).model is None and "model" not in Profile.from_json(
        good()).to_json()
    with pytest.raises(ProfileError, match=r"^profile\.model\.hidden_size: expected a positive "
                                           r"integer, got '64'$"):
        Profile.from_json(dict(good(), model=dict(RECORD, hidden_size="64")))
    with pytest.raises(ProfileError, match=r"^profile\.model: expected an object, got list$"):
        Profile.from_json(dict(good(), model=[]))


def _config(hidden=64, batch=16, microbatches=2, seq_len=128):
    from skyjax.config import defaults as config_defaults

    c = config_defaults.base_config()
    for k in ("vocab_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
              "max_position_embeddings", "type_vocab_size", "hidden_act", "attention"):
        c.model[k] = RECORD[k]
    c.model.hidden_size = hidden
    c.data.batch_size, c.pipeline.microbatches, c.data.seq_len = batch, microbatches, seq_len
    c.cluster.num_devices = 2
    return c


def _saved(tmp_path, **changes) -> str:
    path = str(tmp_path / "profile.json")
    d = good()
    if changes.pop("record", True):
        d["model"] = dict(RECORD, **changes)
    save_profile(Profile.from_json(d), path)
    return path


def test_a_run_given_a_profile_of_another_model_or_micro_batch_is_refused(tmp_path):
    """Same unit and device counts are not enough: the times are another model's."""
    from skyjax import startup

    config = _config()
    config.profile.path = _saved(tmp_path)
    startup.check_profile_path(config)  # measured for this model and micro-batch (8 x 128)
    where = re.escape(f"config.profile.path={config.profile.path!r}")
    config.model.hidden_size = 128
    with pytest.raises(ProfileError, match=rf"^{where} was measured for hidden_size=64; this "
                                           r"run has hidden_size=128 \(config\.model\."
                                           r"hidden_size\): profile again"):
        startup.check_profile_path(config)
    config = _config(microbatches=4)
    config.profile.path = _saved(tmp_path)
    with pytest.raises(ProfileError, match=r"was measured with micro-batches of 8 x 128 \(size x "
                                           r"seq_len\); this run's are 4 x 128 \(config\.data\."
                                           r"batch_size / config\.pipeline\.microbatches x "
                                           r"config\.data\.seq_len\)"):
        startup.check_profile_path(config)
    config = _config()
    config.train.compute_dtype = "bfloat16"
    config.profile.path = _saved(tmp_path)
    with pytest.raises(ProfileError, match=r"compute_dtype='float32'; this run has "
                                           r"compute_dtype='bfloat16' \(config\.train\."):
        startup.check_profile_path(config)
    config.train.compute_dtype = "auto"  # known once JAX sees the devices: checked then
    startup.check_profile_path(config)
    # A record's key that this run does not know, or a record without a key, is not compared.
    config = _config()
    config.profile.path = _saved(tmp_path, future_key="x")
    older = json.load(open(config.profile.path))
    del older["model"]["granularity"]
    json.dump(older, open(config.profile.path, "w"))
    config.allocation.granularity = "sublayer"
    startup.check_profile_path(config)


def test_a_profile_without_a_record_is_still_accepted(tmp_path):
    """Older files and hand-built (FLOP-model) profiles have no record: read as before."""
    from skyjax import startup
    from skyjax.profile.format import check_measured_for

    config = _config(hidden=1024, batch=4, microbatches=1, seq_len=16)
    config.profile.path = _saved(tmp_path, record=False)
    startup.check_profile_path(config)
    assert check_measured_for(load_profile(config.profile.path), RECORD, (1, 1), "p", {}) is False
