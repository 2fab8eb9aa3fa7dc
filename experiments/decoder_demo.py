"""The decoder demo of the language-model walkthrough (docs/guide/decoder.md), and what it
reports (prints its summary).

Runs ``python -m skyjax.main --config configs/gpt2_text.py --workdir DIR`` (a tiny GPT-2 on the
shipped corpus over four emulated devices, two of them four times slower; the even split timed
for its first steps, then the chosen plan) and prints its last log line and, from
``summary.json``, the held-out perplexity, the first and final training loss, the measured and
predicted median step and the calibration's two step times and speed-up. ``--config`` runs
another (``configs/llama_text.py``).

Run: ``python -m experiments.decoder_demo`` (about a minute on 2 cores; ``--workdir`` keeps the
run there).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workdir", help="where the run goes (default: a temporary directory)")
    ap.add_argument("--config", default="configs/gpt2_text.py")
    args = ap.parse_args(argv)
    workdir = args.workdir or tempfile.mkdtemp(prefix="skyjax_decoder_")
    cmd = [sys.executable, "-m", "skyjax.main", "--config", args.config, "--workdir", workdir]
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    if done.returncode:
        sys.exit(f"the decoder demo failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
    with open(os.path.join(workdir, "summary.json")) as f:
        s = json.load(f)
    with open(os.path.join(workdir, "metrics.jsonl")) as f:
        first = next(json.loads(line) for line in f if '"loss"' in line)
    last = [ln for ln in done.stderr.splitlines() if "summary: " in ln][-1]
    print(last[last.index("summary: "):])
    c = s["calibration"] or {}
    print()
    print("| eval perplexity | first loss | final loss | median step (s) | predicted (s) "
          "| even split (s/step) | chosen plan (s/step) | speed-up | wall (s) |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    print(f"| {s['eval_perplexity']:.2f} | {first['loss']:.4f} | {s['final_loss']:.4f} | "
          f"{s['step_time_s']:.4f} | {s['predicted_step_time_s']:.4f} | "
          f"{c.get('step_time_s', float('nan')):.4f} | "
          f"{c.get('chosen_step_time_s', float('nan')):.4f} | "
          f"{c.get('speedup', float('nan')):.2f}x | {s['wall_time_s']:.1f} |")


if __name__ == "__main__":
    from experiments import results_doc

    results_doc.run(main, [(
        None, "decoder_demo", "The decoder demo",
        "`python -m skyjax.main --config configs/gpt2_text.py` (a GPT-2 of 4 layers, hidden 64, "
        "tied embeddings, on `configs/data/tiny_corpus`) on the demo's four emulated CPU "
        "devices, devices 1 and 2 four times slower: its last log line, then the figures of its "
        "`summary.json` (`calibration`: the even split's mean step over the first steps, the "
        "chosen plan's after them, each without its compiling step) and its first logged "
        "loss.")])
