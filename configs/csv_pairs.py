"""Your own data, as a CSV file: the demo's small BERT learns sentence pairs labelled with strings
(``entailment``, ``neutral``, ``contradiction``) from ``configs/data/pairs/train.csv`` on 2
emulated devices, scored on ``dev.csv`` with accuracy and Matthews correlation.

    python -m skyjax.main --config configs/csv_pairs.py --workdir /tmp/skyjax_csv

The label names in id order are written to ``WORKDIR/labels.json`` (and recorded in checkpoints).
For your own files change ``data.name``, ``data.eval_files``, ``data.text_columns``,
``data.label_column`` and ``model.num_labels``, and start from a pretrained BERT with
``--config.model.pretrained=DIR`` (its tokenizer is used unless ``data.tokenizer`` names another).
"""

import os

from configs import local_demo

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "pairs")


def get_config():
    config = local_demo.get_config()
    config.unlock()
    config.data.name = os.path.join(DATA, "train.csv")
    config.data.eval_files = (os.path.join(DATA, "dev.csv"),)
    config.data.text_columns = ("premise", "hypothesis")
    config.data.label_column = "label"
    config.data.tokenizer = DATA  # vocab.txt: the words of the files
    config.data.metric = "matthews"
    config.data.seq_len = 24
    config.model.num_labels = 3
    config.cluster.num_devices = 2
    config.cluster.slowdowns = (1, 3)
    config.allocation.calibrate_steps = 0
    config.train.steps = 300
    config.lock()
    return config
