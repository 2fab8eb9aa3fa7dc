"""experiments/slurm/train.sbatch, checked without SLURM: its bash parses, and the command line
that ``srun`` would start on every task (run here through stand-ins for ``srun``, ``python`` and
``hostname``) is accepted by skyjax.main's real flags and config checks."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "experiments", "slurm", "train.sbatch")
TINY_BERT = os.path.join(ROOT, "tests", "fixtures", "tiny_bert")

pytestmark = pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")

STANDINS = {
    # srun: run the task command once, as task 0 of the job would.
    "srun": '#!/bin/bash\nwhile [[ "$1" == --* ]]; do shift; done\n'
            'SLURM_PROCID=0 SLURM_LOCALID=0 exec "$@"\n',
    # python: record the arguments and the transfer address instead of training.
    "python": '#!/bin/bash\nprintf "%s\\n" "$SKYJAX_TRANSFER_HOST" "$@" > "$RECORD"\n',
    "hostname": '#!/bin/bash\necho "10.1.2.3 172.17.0.1"\n',
}


@pytest.mark.parametrize("script", [SCRIPT, os.path.join(ROOT, "experiments", "slurm",
                                                         "requeue.sbatch")])
def test_bash_parses_the_script(script):
    r = subprocess.run(["bash", "-n", script], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def srun_command(tmp_path, **env) -> tuple[str, list[str]]:
    """(SKYJAX_TRANSFER_HOST, python's arguments) of the task command the script starts."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, body in STANDINS.items():
        (bin_dir / name).write_text(body)
        (bin_dir / name).chmod(0o755)
    record = tmp_path / "argv.txt"
    full = dict(os.environ, PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
                RECORD=str(record), SLURM_SUBMIT_DIR=ROOT, SLURM_JOB_ID="4242",
                SLURM_NTASKS="8", SLURM_JOB_NUM_NODES="2", **env)
    r = subprocess.run(["bash", SCRIPT], capture_output=True, text=True, env=full, timeout=60)
    assert r.returncode == 0, r.stderr
    host, *argv = record.read_text().splitlines()
    return host, argv


def test_task_command_passes_skyjax_main_flags_and_config_checks(tmp_path):
    data_dir = tmp_path / "tfds"
    data_dir.mkdir()
    pretrained = tmp_path / "bert"  # a checkpoint directory as the config checks see it
    pretrained.mkdir()
    shutil.copy(os.path.join(TINY_BERT, "config.json"), pretrained)
    vocab = json.load(open(pretrained / "config.json"))["vocab_size"]
    (pretrained / "vocab.txt").write_text("".join(f"[unused{i}]\n" for i in range(vocab)))
    host, argv = srun_command(tmp_path, PRETRAINED=str(pretrained), DATA_DIR=str(data_dir),
                              WORKDIR=str(tmp_path / "out"), STEPS="7",
                              TRANSFER_PORTS="40000-40100",
                              EXTRA_ARGS="--config.train.log_every=5 --config.data.seq_len=32")
    assert host == ""  # found by each task at start-up: the route to the coordinator
    assert argv[:2] == ["-m", "skyjax.main"]
    flags = argv[2:]
    assert f"--workdir={tmp_path / 'out'}" in flags and (tmp_path / "out").is_dir()
    # The real flag parser and config checks of skyjax.main, without starting JAX.
    code = ("import json, sys; from skyjax.cli import flags, train; flags.parse_flags(sys.argv); "
            "from skyjax.config import validate_config; c = train.FLAGS.config; "
            "validate_config(c); print(json.dumps(c.to_dict()))")
    r = subprocess.run([sys.executable, "-c", code, *flags], capture_output=True, text=True,
                       cwd=ROOT, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    config = json.loads(r.stdout.strip().splitlines()[-1])
    assert config["cluster"]["mode"] == "distributed"
    assert config["cluster"]["num_devices"] == 8  # one process per task
    assert config["model"]["pretrained"] == str(pretrained)
    assert config["train"]["steps"] == 7 and config["train"]["log_every"] == 5
    assert config["data"]["name"] == "glue/mnli"
    assert config["cluster"]["transfer_ports"] == "40000-40100"
    assert config["cluster"]["transfer_host"] == ""


def test_transfer_host_command_overrides_the_discovered_address(tmp_path):
    """TRANSFER_HOST_CMD (a pipeline, run by each task) sets SKYJAX_TRANSFER_HOST."""
    host, argv = srun_command(tmp_path, TRANSFER_HOST_CMD="hostname -I | awk '{print $2}'")
    assert host == "172.17.0.1"
    assert "--config.cluster.transfer_ports=" in argv  # empty: $SKYJAX_TRANSFER_PORTS or any


def test_a_misspelt_override_would_fail_the_same_check(tmp_path):
    """The check above would catch a flag the script passes wrongly."""
    code = "import sys; from skyjax.cli import flags, train; flags.parse_flags(sys.argv)"
    r = subprocess.run([sys.executable, "-c", code, "--config=configs/bert_base_mnli.py",
                        "--workdir=x", "--config.cluster.num_device=8"],
                       capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert r.returncode != 0 and "config.cluster.num_device" in r.stderr
