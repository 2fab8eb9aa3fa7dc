"""profile.json: validation names the field; round trip keeps unknown keys; atomic save."""

from __future__ import annotations

import copy
import json
import math
import os

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
