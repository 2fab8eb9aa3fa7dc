"""A cluster's profile composed from its parts, exactly as the cluster file is written or refused
by name (skyjax.profile.cluster_profile, skyjax.profile.cluster_file, python -m
skyjax.profile.compose): kinds placed in regions with a link per region pair, measured kinds
taken from their profiles, and every key written twice, unknown key, count that is no integer,
value out of bounds, model mismatch and bad ``--out`` refused in one line naming the key and the
file, exit status 2."""

from __future__ import annotations

import glob
import json
import os
import re

import numpy as np
import pytest

from skyjax.cli import compose as compose_cli
from skyjax.profile import cluster_profile
from skyjax.profile.cluster_profile import ClusterError, compose, compose_file
from skyjax.profile.format import load_profile, save_profile
from tests.helpers import REPO, run_module


def two_regions(cross_Bps: float = 1.25e9, layers: int = 6) -> dict:
    """16 devices of two kinds in two regions (as experiments/clusters/two_regions.json)."""
    return {"kinds": {"fast": {"flops_per_s": 2e13, "memory_bytes": 6e8},
                      "slow": {"flops_per_s": 1e13, "memory_bytes": 6e8}},
            "model": {"layers": layers},
            "regions": {"eu": {"fast": 4, "slow": 4}, "us": {"fast": 4, "slow": 4}},
            "links": {"inside": {"latency_s": 1e-5, "bandwidth_Bps": 1.25e10},
                      "between": [{"regions": ["eu", "us"], "latency_s": 0.02,
                                   "bandwidth_Bps": cross_Bps}]}}


# ------------------------------------------------------------------------ a cluster from parts

def test_compose_places_kinds_in_regions_with_a_link_per_region_pair():
    spec = two_regions()
    spec["regions"]["asia"] = {"slow": 2}
    spec["links"]["between"].append({"regions": ["us", "asia"], "latency_s": 0.1,
                                     "bandwidth_Bps": 1e8})
    spec["links"]["default"] = {"latency_s": 0.2, "bandwidth_Bps": 5e7}
    p = compose(spec)
    assert p.num_devices == 18 and p.num_units == 8
    regions = [d["region"] for d in p.devices]
    assert regions == ["eu"] * 8 + ["us"] * 8 + ["asia"] * 2
    assert [d["kind"] for d in p.devices[:8]] == ["fast"] * 4 + ["slow"] * 4
    # a slow device takes twice a fast one's unit times (half the FLOP rate, same call cost)
    assert np.allclose(p.forward_s[3, 4] - 20e-6, 2 * (p.forward_s[3, 0] - 20e-6))
    assert p.latency_s[0, 1] == 1e-5 and p.bandwidth_Bps[0, 1] == 1.25e10
    assert p.latency_s[0, 8] == p.latency_s[8, 0] == 0.02
    assert p.latency_s[8, 16] == 0.1 and p.bandwidth_Bps[17, 9] == 1e8
    assert p.latency_s[0, 16] == 0.2 and p.bandwidth_Bps[0, 17] == 5e7  # the default pair
    assert p.latency_s[5, 5] == 0.0
    assert {"int8", "bf16", "int4"} <= set(p.codecs)


def test_compose_takes_a_decoder_from_its_flop_model():
    """``model.family`` gpt2 / llama: FLOP kinds take the decoder's units (flops.decoder_units),
    a tied head records the bytes its gradient exchange sends; a key of BERT's shape, or an
    unknown family, is refused by name."""
    from skyjax.profile.flops import DecoderShape, decoder_units

    spec = two_regions()
    spec["model"] = {"family": "gpt2", "layers": 4, "hidden": 256, "heads": 4, "ffn": 1024,
                     "vocab": 1000, "positions": 128, "seq": 128, "batch": 2, "tied": True}
    p = compose(spec)
    shape = DecoderShape(**{k: v for k, v in spec["model"].items()})
    units = decoder_units(shape)
    assert [u["name"] for u in p.units] == [u["name"] for u in units] and p.num_units == 6
    assert p.units[-1]["tied_bytes"] == 4 * 1000 * 256
    assert "tied_bytes" not in p.units[0]
    assert p.microbatch == {"size": 2, "seq_len": 128}
    for model, words in (({"family": "gpt2", "labels": 3}, "cluster.model.labels"),
                         ({"family": "t5"}, "cluster.model.family")):
        with pytest.raises(ClusterError, match=words):
            compose(dict(spec, model=model))


def test_compose_takes_a_measured_kind_from_its_profile(tmp_path):
    measured = compose({"kinds": {"x": {"flops_per_s": 1e13, "memory_bytes": 1e9}},
                        "model": {"layers": 2}, "regions": {"lab": {"x": 1}},
                        "links": {"inside": {"latency_s": 0, "bandwidth_Bps": 1e9}}})
    measured.forward_s[:] *= 3.0  # as if measured slower than its FLOPs
    save_profile(measured, str(tmp_path / "x.json"))
    p = compose({"kinds": {"x": {"profile": "x.json"},
                           "y": {"flops_per_s": 1e13, "memory_bytes": 1e9}},
                 "model": {"layers": 2}, "regions": {"a": {"x": 2}, "b": {"y": 1}},
                 "links": {"inside": {"latency_s": 1e-5, "bandwidth_Bps": 1e10},
                           "default": {"latency_s": 0.05, "bandwidth_Bps": 1e8}}},
                base=str(tmp_path))
    assert np.allclose(p.forward_s[:, 0], measured.forward_s[:, 0])
    assert np.allclose(p.forward_s[:, 2] * 3.0, measured.forward_s[:, 0])
    assert p.latency_s[0, 2] == 0.05


@pytest.mark.parametrize("edit, words", [
    (lambda s: s["regions"]["eu"].update(gpu=2), "cluster.regions.eu.gpu: no such kind"),
    (lambda s: s["links"].update(between=[]), "no link between regions 'eu' and 'us'"),
    (lambda s: s["kinds"]["fast"].update(flops_per_s=-1), "cluster.kinds.fast.flops_per_s=-1"),
    (lambda s: s["links"]["between"][0].update(regions=["eu", "mars"]),
     "cluster.links.between[0].regions"),
    (lambda s: s["links"]["inside"].pop("bandwidth_Bps"), "cluster.links.inside: missing key"),
])
def test_compose_names_the_bad_key(edit, words):
    spec = two_regions()
    edit(spec)
    with pytest.raises(ClusterError, match=re.escape(words)):
        compose(spec)


@pytest.mark.parametrize("path", sorted(glob.glob(os.path.join(REPO, "experiments", "clusters",
                                                               "*.json"))),
                         ids=os.path.basename)
def test_the_shipped_cluster_files_compose(path):
    with open(path) as f:
        spec = json.load(f)
    p = compose_file(path)
    assert p.num_devices == sum(n for counts in spec["regions"].values()
                                for n in counts.values())


# ------------------------------------------------------------------------ refused by name

BASE = """{"kinds": {"fast": {"flops_per_s": 2e13, "memory_bytes": 6e8},
           "slow": {"flops_per_s": 1e13, "memory_bytes": 6e8}},
 "model": {"layers": 2},
 "regions": {"eu": {"fast": 2, "slow": 2}, "us": {"fast": 2}},
 "links": {"inside": {"latency_s": 1e-5, "bandwidth_Bps": 1.25e10},
           "between": [{"regions": ["eu", "us"], "latency_s": 0.02, "bandwidth_Bps": 1.25e9}]}}"""

MEASURED = """{"kinds": {"a": {"profile": "a.json"}, "b": {"profile": "b.json", "device": 1}},
 "regions": {"lab": {"a": 1, "b": 1}},
 "links": {"inside": {"latency_s": 1e-5, "bandwidth_Bps": 1e10}}}"""

MIXED = """{"kinds": {"a": {"profile": "a.json"}, "f": {"flops_per_s": 1e13, "memory_bytes": 1e9}},
 "model": {"layers": 2, "hidden": 32, "heads": 2, "ffn": 64},
 "regions": {"lab": {"a": 1, "f": 1}},
 "links": {"inside": {"latency_s": 1e-5, "bandwidth_Bps": 1e10}}}"""

# (case, the file, what is replaced, by what, the words of the one line in order)
BAD = [
    ("region written twice", BASE, '"us": {"fast": 2}', '"eu": {"fast": 2}',
     ["cluster.regions.eu: written twice"]),
    ("kind written twice", BASE, '"slow": {"flops_per_s"', '"fast": {"flops_per_s"',
     ["cluster.kinds.fast: written twice"]),
    ("key written twice", BASE, '"layers": 2', '"layers": 2, "layers": 3',
     ["cluster.model.layers: written twice"]),
    ("pair listed twice", BASE, '1.25e9}]',
     '1.25e9}, {"regions": ["us", "eu"], "latency_s": 0.5, "bandwidth_Bps": 1e6}]',
     ["cluster.links.between[1].regions", "listed already", "between[0]"]),
    ("misspelled between", BASE, '"between"', '"betwen"',
     ["cluster.links.betwen: unknown key; did you mean 'between'?"]),
    ("unknown top key", BASE, '"model"', '"modle"',
     ["cluster.modle: unknown key; did you mean 'model'?"]),
    ("unknown kind key", BASE, '"memory_bytes": 6e8}}', '"memory_bytes": 6e8, "flop": 1}}',
     ["cluster.kinds.slow.flop: unknown key"]),
    ("unknown model key", BASE, '"layers": 2', '"layers": 2, "hiden": 64',
     ["cluster.model.hiden: unknown key; did you mean 'hidden'?"]),
    ("unknown link key", BASE, '"latency_s": 1e-5', '"latency": 1e-5',
     ["cluster.links.inside.latency: unknown key; did you mean 'latency_s'?"]),
    ("misspelled kind", BASE, '"us": {"fast": 2}', '"us": {"fats": 2}',
     ["cluster.regions.us.fats: no such kind", "did you mean 'fast'?"]),
    ("count true", BASE, '"us": {"fast": 2}', '"us": {"fast": true}',
     ["cluster.regions.us.fast=true: expected a count of devices (an integer"]),
    ("count 2.0", BASE, '"us": {"fast": 2}', '"us": {"fast": 2.0}',
     ["cluster.regions.us.fast=2.0: expected a count of devices (an integer"]),
    ("count -1", BASE, '"us": {"fast": 2}', '"us": {"fast": -1}',
     ["cluster.regions.us.fast=-1: expected a count of devices"]),
    ("100000 devices", BASE, '"us": {"fast": 2}', '"us": {"fast": 100000}',
     ["cluster.regions.us.fast=100000", "[0, 1024]"]),
    ("devices over the cap in all", BASE, '"us": {"fast": 2}',
     '"us": {"fast": 1000}, "asia": {"fast": 1000}',
     ["cluster.regions.asia.fast=1000", "more than 1024 devices"]),
    ("layers -3", BASE, '"layers": 2', '"layers": -3',
     ["cluster.model.layers=-3: expected an integer in [1, 1024]"]),
    ("layers 2.5", BASE, '"layers": 2', '"layers": 2.5',
     ["cluster.model.layers=2.5: expected an integer in [1, 1024]"]),
    ("layers true", BASE, '"layers": 2', '"layers": true', ["cluster.model.layers=true"]),
    ("hidden absurd", BASE, '"layers": 2', '"layers": 2, "hidden": 1e400',
     ["cluster.model.hidden=Infinity"]),
    ("granularity token", BASE, '"layers": 2', '"layers": 2, "granularity": "token"',
     ['cluster.model.granularity="token": expected one of layer, sublayer']),
    ("bytes per value 3", BASE, '"layers": 2', '"layers": 2, "bytes_per_value": 3',
     ["cluster.model.bytes_per_value=3: expected 2 or 4"]),
    ("bytes per value 4.0", BASE, '"layers": 2', '"layers": 2, "bytes_per_value": 4.0',
     ["cluster.model.bytes_per_value=4.0: expected 2 or 4"]),
    ("flops Infinity", BASE, '"flops_per_s": 2e13', '"flops_per_s": Infinity',
     ["cluster.kinds.fast.flops_per_s=Infinity: expected FLOP per second in [1e+06, 1e+18]"]),
    ("flops NaN", BASE, '"flops_per_s": 2e13', '"flops_per_s": NaN',
     ["cluster.kinds.fast.flops_per_s=NaN"]),
    ("flops absurd", BASE, '"flops_per_s": 2e13', '"flops_per_s": 2e30',
     ["cluster.kinds.fast.flops_per_s=2e+30", "1e+18"]),
    ("flops a string", BASE, '"flops_per_s": 2e13', '"flops_per_s": "2e13"',
     ['cluster.kinds.fast.flops_per_s="2e13"']),
    ("memory Infinity", BASE, '"memory_bytes": 6e8}}', '"memory_bytes": Infinity}}',
     ["cluster.kinds.slow.memory_bytes=Infinity: expected a whole number of bytes in "
      "[1, 2^50]"]),
    ("memory a fraction", BASE, '"memory_bytes": 6e8}}', '"memory_bytes": 0.5}}',
     ["cluster.kinds.slow.memory_bytes=0.5"]),
    ("latency Infinity", BASE, '"latency_s": 0.02', '"latency_s": Infinity',
     ["cluster.links.between[0].latency_s=Infinity: expected seconds in [0, 3600]"]),
    ("bandwidth zero", BASE, '"bandwidth_Bps": 1.25e10', '"bandwidth_Bps": 0',
     ["cluster.links.inside.bandwidth_Bps=0: expected bytes per second in [1, 1e+15]"]),
    ("both measured and a FLOP model", MEASURED, '"profile": "a.json"',
     '"profile": "a.json", "flops_per_s": 1e13', ["cluster.kinds.a.flops_per_s", "not both"]),
    ("device 2.9", MEASURED, '"device": 1', '"device": 2.9',
     ["cluster.kinds.b.device=2.9: expected a device index (an integer in [0, 1023])"]),
    ("device abc", MEASURED, '"device": 1', '"device": "abc"',
     ['cluster.kinds.b.device="abc": expected a device index']),
    ("device true", MEASURED, '"device": 1', '"device": true', ["cluster.kinds.b.device=true"]),
    ("device past the profile's", MEASURED, '"device": 1', '"device": 2',
     ["cluster.kinds.b.device=2", "b.json has 2 devices"]),
    ("model beside measured kinds only", MEASURED, '"regions"', '"model": {"layers": 2}, "regions"',
     ["cluster.model: only FLOP kinds"]),
    ("kinds measured on other models", MEASURED, '"b.json"', '"wide.json"',
     ["cluster.kinds.b.profile", "wide.json was measured for hidden_size=64", "a.json",
      "hidden_size=32"]),
    ("kinds measured on other models, unrecorded", MEASURED, '"b.json"', '"wide_unrecorded.json"',
     ["cluster.kinds.b.profile", "wide_unrecorded.json's unit 0", "a.json"]),
    ("a FLOP model other than the measured one", MIXED, '"hidden": 32', '"hidden": 64',
     ["cluster.model.hidden=64", "a.json", "hidden_size=32"]),
]


def measured_profiles(folder) -> None:
    """a.json and b.json: one model (hidden 32) recorded; wide.json: hidden 64 recorded,
    wide_unrecorded.json: hidden 64 without the record; two devices each, four units."""
    for name, hidden, record in [("a", 32, True), ("b", 32, True), ("wide", 64, True),
                                 ("wide_unrecorded", 64, False)]:
        p = compose({"kinds": {"x": {"flops_per_s": 1e13, "memory_bytes": 1e9}},
                     "model": {"layers": 2, "hidden": hidden, "heads": 2, "ffn": 2 * hidden},
                     "regions": {"lab": {"x": 2}},
                     "links": {"inside": {"latency_s": 0, "bandwidth_Bps": 1e9}}})
        if record:
            p.model = {"hidden_size": hidden, "num_hidden_layers": 2, "granularity": "layer"}
        save_profile(p, str(folder / f"{name}.json"))


@pytest.mark.parametrize("text, old, new, words", [c[1:] for c in BAD], ids=[c[0] for c in BAD])
def test_a_cluster_file_is_refused_by_key_and_file(tmp_path, capsys, text, old, new, words):
    measured_profiles(tmp_path)
    good = tmp_path / "good.json"
    good.write_text(text)
    compose_file(str(good))  # as written, it composes
    assert text.count(old) == 1
    path = tmp_path / "cluster.json"
    path.write_text(text.replace(old, new))
    line = re.escape(str(path)) + ": .*" + ".*".join(map(re.escape, words))
    with pytest.raises(ClusterError, match=line):
        compose_file(str(path))
    out = tmp_path / "profile.json"
    assert compose_cli.main(["--cluster", str(path), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and re.match("skyjax.profile.compose: " + line, err), err
    assert not out.exists()


# (case, --out given what, the words of the one line)
OUTS = [("a directory", lambda d: str(d), "is a directory"),
        ("the cluster file", lambda d: str(d / "cluster.json"), "is the cluster file"),
        ("the cluster file by another path", lambda d: str(d / "sub" / ".." / "cluster.json"),
         "is the cluster file"),
        ("a link to the cluster file", lambda d: str(d / "link.json"), "is the cluster file"),
        ("in no directory", lambda d: str(d / "none" / "p.json"), "none does not exist")]


@pytest.mark.parametrize("where, words", [c[1:] for c in OUTS], ids=[c[0] for c in OUTS])
def test_out_is_checked_before_any_work(tmp_path, capsys, where, words):
    (tmp_path / "sub").mkdir()
    cluster = tmp_path / "cluster.json"
    text = BASE.replace('"between"', '"betwen"')  # refused, but only once --out passes
    cluster.write_text(text)
    os.symlink(cluster, tmp_path / "link.json")
    out = where(tmp_path)
    line = re.escape(f"--out {out}") + ".*" + re.escape(words)
    with pytest.raises(ClusterError, match=line):
        cluster_profile.write_profile(str(cluster), out)
    assert compose_cli.main(["--cluster", str(cluster), "--out", out]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and re.search(line, err), err
    assert cluster.read_text() == text


def test_the_command_ends_in_one_line_and_exit_2(tmp_path):
    cluster = tmp_path / "c.json"
    cluster.write_text(BASE)
    out = run_module("skyjax.profile.compose", "--cluster", str(cluster), "--out",
                     str(tmp_path / "p.json"))
    assert out.returncode == 0, out.stderr
    assert "6 devices, 4 units" in out.stdout
    assert load_profile(str(tmp_path / "p.json")).num_devices == 6
    out = run_module("skyjax.profile.compose", "--cluster", str(cluster), "--out", str(cluster))
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.count("\n") == 1 and "is the cluster file" in out.stderr, out.stderr
    assert cluster.read_text() == BASE
    cluster.write_text(BASE.replace('"us": {"fast": 2}', '"eu": {"fast": 2}'))
    out = run_module("skyjax.profile.compose", "--cluster", str(cluster), "--out",
                     str(tmp_path / "q.json"))
    assert out.returncode == 2 and out.stderr.count("\n") == 1, out.stderr
    assert f"{cluster}: cluster.regions.eu: written twice" in out.stderr
