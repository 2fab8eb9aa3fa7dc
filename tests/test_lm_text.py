"""Text for a causal language model (skyjax.data.lm_text): documents tokenised with the
checkpoint's tokenizer, packed with end-of-text separators into sequences whose labels are the
next tokens, segment ids that keep attention inside documents, the same batches for the same
seed, held-out splits, and the perplexity of skyjax.scores against a hand computation. The
tokenizers are byte-level BPEs trained here on the shipped corpus (nothing is downloaded)."""

from __future__ import annotations

import math
import os

import numpy as np
import pytest

from skyjax import scores
from skyjax.data import lm_sources, lm_text
from skyjax.data.text import DataError
from tests.helpers import REPO

CORPUS = os.path.join(REPO, "configs", "data", "tiny_corpus")
CORPUS_JSONL = os.path.join(REPO, "configs", "data", "tiny_corpus.jsonl")
EOT = "<|endoftext|>"


def _bpe(texts: list[str], special: list[str]) -> object:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=special, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts, trainer)
    return tok


def _save(path: str, texts: list[str], special: list[str], **tokens: str) -> str:
    """A transformers tokenizer directory: a byte-level BPE with these special tokens."""
    from transformers import PreTrainedTokenizerFast

    PreTrainedTokenizerFast(tokenizer_object=_bpe(texts, special), **tokens).save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def tokenizers(tmp_path_factory) -> dict[str, str]:
    """GPT-2-style (one ``<|endoftext|>``), Llama-style (``<s>`` ... ``</s>``, pad ``<pad>``)
    and one without an end-of-text token."""
    texts = [t for _, t in lm_sources.read_documents(CORPUS)]
    root = tmp_path_factory.mktemp("tokenizers")
    return {"gpt2": _save(str(root / "gpt2"), texts, [EOT], eos_token=EOT, bos_token=EOT),
            "llama": _save(str(root / "llama"), texts, ["<pad>", "<s>", "</s>"], bos_token="<s>",
                           eos_token="</s>", pad_token="<pad>"),
            "none": _save(str(root / "none"), texts, [])}


def _config(tokenizer: str, name: str = CORPUS, **data):
    from skyjax.config import defaults

    config = defaults.base_config()
    config.data.name, config.data.tokenizer = name, tokenizer
    config.data.seq_len, config.data.batch_size, config.data.eval_examples = 16, 4, -1
    config.data.prefetch = 1
    config.model.vocab_size = 512  # the tokenizers' 400 ids fit
    for key, value in data.items():
        config.data[key] = value
    return config


def _tok(path: str):
    return lm_text.load_tokenizer(path)


def test_packing_by_hand(tokenizers):
    tok = _tok(tokenizers["gpt2"])
    eos = tok.eos_token_id
    a, b = tok("bread and water", add_special_tokens=False)["input_ids"], \
        tok("the river", add_special_tokens=False)["input_ids"]
    packed = lm_text.pack(tok, [("x", "bread and water"), ("y", "the river")])
    assert packed.tokens.tolist() == a + [eos] + b + [eos]
    assert packed.docs.tolist() == [0] * (len(a) + 1) + [1] * (len(b) + 1)
    stream, seq_len = packed.tokens, 3
    n = packed.num_sequences(seq_len)
    assert n == (len(stream) - 1) // 3
    batch = lm_text.sequences(packed, np.arange(n), seq_len, document_mask=False, pad=eos)
    assert set(batch) == {"input_ids", "labels", "attention_mask"}
    for k in range(n):  # inputs t[3k : 3k + 3], next tokens t[3k + 1 : 3k + 4]
        assert batch["input_ids"][k].tolist() == stream[3 * k:3 * k + 3].tolist()
        assert batch["labels"][k].tolist() == stream[3 * k + 1:3 * k + 4].tolist()
    assert all(v.dtype == np.int32 and v.shape == (n, 3) for v in batch.values())
    assert batch["attention_mask"].all()


def test_segment_ids_and_labels_with_document_mask(tokenizers):
    tok = _tok(tokenizers["llama"])  # <s> opens, </s> closes each document
    bos, eos = tok.bos_token_id, tok.eos_token_id
    assert lm_text.separators(tok) == ([bos], [eos])
    docs = [("a", "bread"), ("b", "a river"), ("c", "the clock ticks")]
    packed = lm_text.pack(tok, docs)
    seq_len = len(packed.tokens) - 1  # one sequence holds the whole stream
    batch = lm_text.sequences(packed, np.array([0]), seq_len, document_mask=True, pad=0)
    ids, labels, seg = batch["input_ids"][0], batch["labels"][0], batch["segment_ids"][0]
    assert ids[0] == bos and seg.tolist() == packed.docs[:-1].tolist()
    # no target crosses a document: the label of each closing </s> is IGNORE, the others are
    # the next token
    ends = np.flatnonzero(ids == eos)
    assert len(ends) == 2 and (labels[ends] == lm_text.IGNORE).all()
    keep = labels != lm_text.IGNORE
    assert (labels[keep] == packed.tokens[1:][keep]).all() and keep.sum() == seq_len - 2
    mask = lm_text.block_causal_mask(batch["segment_ids"], batch["attention_mask"])[0]
    for q in range(seq_len):
        for k in range(seq_len):
            assert mask[q, k] == (k <= q and packed.docs[q] == packed.docs[k])
    positions = lm_text.document_positions(batch["segment_ids"])[0]
    starts = np.r_[0, np.flatnonzero(np.diff(seg)) + 1]
    assert (positions[starts] == 0).all() and positions[-1] == seq_len - 1 - starts[-1]
    # a sequence that starts mid-document numbers its documents from 0
    later = lm_text.sequences(packed, np.array([1]), 4, document_mask=True, pad=0)
    assert later["segment_ids"][0, 0] == 0
    assert (np.diff(later["segment_ids"][0]) >= 0).all()


def test_training_batches_are_a_pure_function_of_seed_and_step(tokenizers):
    config = _config(tokenizers["gpt2"], document_mask=True)
    make = lm_text.train_batch_fn(config)
    first = [make(i) for i in range(6)]
    again = lm_text.train_batches(config, start_step=2)
    try:
        for i in range(2, 6):
            got = next(again)
            assert got.keys() == first[i].keys()
            assert all((got[k] == first[i][k]).all() for k in got)
    finally:
        again.close()
    assert first[0]["input_ids"].shape == (4, 16) and "weights" not in first[0]
    assert (first[0]["segment_ids"] >= 0).all() and first[0]["attention_mask"].all()
    config.train.seed = 1
    other = lm_text.train_batch_fn(config)(0)
    assert not (other["input_ids"] == first[0]["input_ids"]).all()
    # every epoch visits each packed sequence once, in an order of the seed
    corpus = lm_text.load(config)
    n = corpus.train.num_sequences(16)
    config.data.batch_size = n
    epoch = lm_text.train_batch_fn(config)(0)["input_ids"]
    whole = lm_text.sequences(corpus.train, np.arange(n), 16, document_mask=False, pad=0)
    assert sorted(map(tuple, epoch.tolist())) == sorted(map(tuple, whole["input_ids"].tolist()))


def test_held_out_fraction_and_files(tokenizers, tmp_path):
    config = _config(tokenizers["gpt2"], eval_fraction=0.2)
    train_docs, evals = lm_text.documents(config)
    assert list(evals) == ["validation"] and len(evals["validation"]) == 1
    assert len(train_docs) == 4 and not set(train_docs) & set(evals["validation"])
    config.train.seed = 7  # the held-out documents do not depend on the training seed
    assert lm_text.documents(config)[1] == evals
    batches = lm_text.eval_split_batches(config)["validation"]
    packed = lm_text.load(config).evals["validation"]
    n = packed.num_sequences(16, partial=True)
    weights = np.concatenate([b["weights"] for b in batches])
    assert weights.sum() == n and len(weights) == 4 * math.ceil(n / 4)
    labels = np.concatenate([b["labels"] for b in batches])
    assert (labels != lm_text.IGNORE).sum() == len(packed.tokens) - 1  # each token but the first
    last = batches[-1]
    assert (last["labels"][last["weights"] == 0] == lm_text.IGNORE).all()
    config.data.eval_examples = 2
    assert [b["weights"].tolist() for b in lm_text.eval_split_batches(config)["validation"]] == [
        [1, 1, 0, 0]]
    held = tmp_path / "held.txt"
    held.write_text("The baker wrote a letter to the keeper of the lighthouse.")
    config = _config(tokenizers["llama"], name=CORPUS_JSONL, eval_files=(str(held),))
    batches = lm_text.eval_split_batches(config)["held"]
    pad = lm_text.load(config).pad
    assert pad == _tok(tokenizers["llama"]).pad_token_id
    last = np.flatnonzero(batches[-1]["weights"])[-1]  # the padded last sequence
    row = batches[-1]["attention_mask"][last]
    assert 0 < row.sum() < 16 and (batches[-1]["input_ids"][last][row == 0] == pad).all()
    assert (batches[-1]["labels"][last][row.sum() - 1:] == lm_text.IGNORE).all()
    with pytest.raises(DataError, match="both set"):
        lm_text.documents(_config(tokenizers["gpt2"], eval_fraction=0.5, eval_files=(str(held),)))
    with pytest.raises(DataError, match=r"eval_fraction=0.5 of the 1 document\(s\)"):
        lm_text.documents(_config(tokenizers["gpt2"], name=str(held), eval_fraction=0.5))


def test_hf_source_saved_to_disk(tokenizers, tmp_path):
    datasets = pytest.importorskip("datasets", reason="the hf: source needs Hugging Face datasets")
    texts = [t for _, t in lm_sources.read_documents(CORPUS)]
    path = str(tmp_path / "saved")
    datasets.DatasetDict({"train": datasets.Dataset.from_dict({"text": texts[:4]}),
                          "validation": datasets.Dataset.from_dict({"text": texts[4:]})}
                         ).save_to_disk(path)
    config = _config(tokenizers["gpt2"], name=f"hf:{path}")
    files = _config(tokenizers["gpt2"], name=CORPUS)
    assert (lm_text.load(config).train.tokens[:50] == lm_text.load(files).train.tokens[:50]).all()
    assert list(lm_text.eval_split_batches(config)) == ["validation"]


def test_bad_tokenizer_and_too_little_text(tokenizers, tmp_path):
    with pytest.raises(DataError, match=r"config.data.tokenizer='.*none': the tokenizer has no "
                                        r"end-of-text token \(eos_token\)"):
        lm_text.train_batch_fn(_config(tokenizers["none"]))
    with pytest.raises(DataError, match=r"tokenizer directory not found"):
        lm_text.load_tokenizer(str(tmp_path / "missing"))
    config = _config(tokenizers["gpt2"])
    config.data.tokenizer = ""
    with pytest.raises(DataError, match="needs a tokenizer"):
        lm_text.load(config)
    short = tmp_path / "short.txt"
    short.write_text("bread")
    with pytest.raises(DataError, match=r"short.txt: its training text is \d+ tokens, fewer than "
                                        r"config.data.seq_len \+ 1 = 17"):
        lm_text.train_batch_fn(_config(tokenizers["gpt2"], name=str(short)))
    config = _config(tokenizers["gpt2"])
    config.model.vocab_size = 50
    with pytest.raises(DataError, match=r"outside the model's vocabulary of 50"):
        lm_text.load(config)


def test_perplexity_by_hand():
    # per token: NLLs of 5 targets (two positions without a target, whatever their NLL)
    nll = np.array([[0.5, 1.0, 9.0], [2.0, 0.25, 7.0], [0.75, 3.0, 3.0]])
    has_target = np.array([[1, 1, 0], [1, 1, 0], [1, 0, 0]])
    mean = (0.5 + 1.0 + 2.0 + 0.25 + 0.75) / 5
    got = scores.perplexity(nll, has_target)
    assert got == {"eval_loss": pytest.approx(0.9), "eval_perplexity": pytest.approx(math.exp(0.9)),
                   "eval_tokens": 5}
    assert mean == pytest.approx(0.9)
    # per sequence: NLL sums and target counts give the same, token-weighted (not the mean of
    # the sequences' means)
    sums, counts = np.array([1.5, 2.25, 0.75, 123.0]), np.array([2, 2, 1, 0])
    assert scores.perplexity(sums, counts) == got
    assert scores.perplexity(np.zeros(3), np.zeros(3)) == {}
    assert scores.perplexity(np.array([800.0]), np.array([1]))["eval_perplexity"] == math.inf
