"""GLUE input pipeline against the training pipeline, side by side, offline.

    python experiments/data_throughput.py                    # demo-size model, MNLI pairs
    python experiments/data_throughput.py --model base       # BERT-base shape (slow on CPU)

MNLI comes from ``tfds.testing.mock_data`` (random pairs of words over a small alphabet, the same
code path as a prepared dataset: ``tfds.data_source`` + ``BertTokenizerFast``) with a WordPiece
vocabulary written here. Printed: examples/s of reading + tokenising + batching alone (the
source's batch function called directly, and consumed through the prefetch thread), and
examples/s of training the model on the same batches through ``train_and_evaluate`` (one
process, ``--devices`` local CPU stages). The input pipeline keeps up when its rate is well above
the training rate.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time

if "XLA_FLAGS" not in os.environ:  # before JAX starts: local CPU devices for the stages
    os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=4"

VOCAB = (["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + list("abcdefghij")
         + ["##" + c for c in "abcdefghij"] + ["abc", "##de", "hi", "##fg", "ij", "##bc"])
SHAPES = {
    "demo": dict(hidden_size=128, num_hidden_layers=4, num_attention_heads=4,
                 intermediate_size=512),
    "base": dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
                 intermediate_size=3072),
}


def make_config(args: argparse.Namespace, vocab_dir: str):
    from skyjax.config import base_config

    config = base_config()
    config.model.update(SHAPES[args.model])
    config.model.vocab_size = 128
    config.model.max_position_embeddings = 512
    config.model.num_labels = 3
    config.data.name = "glue/mnli"
    config.data.tokenizer = vocab_dir
    config.data.seq_len = args.seq_len
    config.data.batch_size = args.batch_size
    config.data.eval_examples = 0
    config.pipeline.microbatches = 4
    config.cluster.num_devices = args.devices
    config.allocation.strategy = "even"
    config.profile.repeats = 2
    config.train.steps = args.train_steps
    config.train.log_every = args.train_steps
    return config


def build_rate(config, batches: int) -> float:
    """examples/s of the source's batch function called in this thread."""
    from skyjax.data import glue

    make = glue.train_batch_fn(config)
    make(0)  # opening the split and the tokenizer is not throughput
    tic = time.perf_counter()
    for i in range(1, batches + 1):
        make(i)
    return batches * config.data.batch_size / (time.perf_counter() - tic)


def data_rate(config, batches: int, prefetch: int) -> float:
    """examples/s of batches taken from the prefetch thread, ``prefetch`` batches ahead."""
    from skyjax import data

    config.data.prefetch = prefetch
    it = data.train_batches(config)
    next(it)  # opening the split and the tokenizer is not throughput
    tic = time.perf_counter()
    for _ in range(batches):
        next(it)
    elapsed = time.perf_counter() - tic
    it.close()
    return batches * config.data.batch_size / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", choices=sorted(SHAPES), default="demo")
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--batches", type=int, default=40)
    parser.add_argument("--devices", type=int, default=2)
    parser.add_argument("--train-steps", type=int, default=12)
    args = parser.parse_args()

    import tensorflow_datasets as tfds
    import tensorflow_datasets.text.glue  # noqa: F401  registers glue/*

    from skyjax import train

    with tempfile.TemporaryDirectory() as tmp, tfds.testing.mock_data(
            policy=tfds.testing.MockPolicy.USE_CODE, num_examples=4096):
        with open(os.path.join(tmp, "vocab.txt"), "w") as f:
            f.write("\n".join(VOCAB) + "\n")
        config = make_config(args, tmp)
        inline = build_rate(config, args.batches)
        prefetched = data_rate(config, args.batches, prefetch=4)
        config.data.prefetch = 4
        summary = train.train_and_evaluate(config, os.path.join(tmp, "run"))
    steps = summary["step_time_s"]
    train_rate = args.batch_size / steps
    print(json.dumps({"model": args.model, "seq_len": args.seq_len,
                      "batch_size": args.batch_size}))
    print(f"{'pipeline part':<44} {'examples/s':>10}")
    print(f"{'read + tokenise + batch (inline)':<44} {inline:>10.0f}")
    print(f"{'read + tokenise + batch (prefetch thread)':<44} {prefetched:>10.0f}")
    print(f"{f'training, {args.devices} stages ({args.model} model)':<44} {train_rate:>10.1f}")
    print(f"input pipeline / training: {inline / train_rate:.0f}x")


if __name__ == "__main__":
    main()
