"""Text for a causal language model: documents (:mod:`.lm_sources`) tokenised with the
checkpoint's tokenizer, packed into fixed-length sequences, and batched as the runtime takes
them (a global batch of ``config.data.batch_size`` rows, cut into micro-batches by the runtime).

Packing. Each document is tokenised without special tokens and closed by the tokenizer's
end-of-text token (``eos_token``); a tokenizer whose beginning-of-text token is another token
(Llama's ``<s>``) also opens each document with it (GPT-2's are one token, ``<|endoftext|>``,
which then only separates). The documents, in order, make one token stream ``t[0..T)``;
sequence ``k`` reads ``t[kL : kL + L + 1]`` (``L = config.data.seq_len``): its inputs are the
first ``L`` tokens, its targets the last ``L``, so every token of the stream but the first is a
target exactly once. Training keeps the ``(T - 1) // L`` full sequences (the tail is dropped);
a held-out split keeps them all, the last padded.

A batch is a dict of numpy arrays, ``[B, L]`` each:

* ``input_ids`` int32: the tokens (padding: the tokenizer's pad token, else its eos);
* ``labels`` int32: the next token, already shifted (``labels[b, t]`` is the target of position
  ``t``), :data:`IGNORE` (-100) where there is none: padding, and, with ``document_mask``, the
  last token of a document (whose next token is another document's);
* ``attention_mask`` int32: 1 on tokens, 0 on padding;
* ``segment_ids`` int32, only with ``config.data.document_mask``: each token's document,
  numbered from 0 within its sequence (the document a sequence starts in is 0; padding one past
  the last). Token ``q`` may attend to token ``k`` when ``k <= q``, both have the same segment
  id and ``attention_mask[k]`` is 1: :func:`block_causal_mask`, the reference the model's mask
  is tested against. Positions stay ``0..L-1`` per sequence (:func:`document_positions` gives
  them per document, for a model that wants them);
* held-out batches add ``weights`` float32 ``[B]``: 0 on rows that only fill the last batch
  (their ``labels`` are all :data:`IGNORE`).

Order. Training batch ``i`` holds the sequences at stream positions ``[i·B, (i+1)·B)`` of
:class:`skyjax.data.text.EpochOrder` (epoch ``e`` is ``default_rng((seed, e)).permutation(n)``
of the ``n`` sequences): a pure function of ``(config.train.seed, i)``, as every source's.
Held-out sequences are read in order; ``config.data.eval_examples`` caps their number per split
(-1: all). The loss and perplexity of a split are :func:`skyjax.scores.perplexity`'s.

Config keys (``config.data``; defaults where a config lacks one): ``name`` (the source),
``text_column`` ("text"), ``txt_documents`` ("file" | "paragraph"), ``eval_files`` (held-out
files, one split each, named after the file), ``eval_fraction`` (0.0; else that fraction of the
documents, at least one, is the held-out split ``"validation"``, chosen by
``default_rng(0)``, whatever the training seed), ``hf_subset``, ``train_split`` and
``eval_splits`` (``hf:``), ``document_mask`` (False), ``seq_len``, ``batch_size``,
``eval_examples``, ``tokenizer`` (else ``config.model.pretrained``).

This module imports numpy at import time; transformers when a tokenizer is loaded.
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from skyjax.data import lm_sources, readers, text
from skyjax.data.prefetch import Prefetcher
from skyjax.data.text import DataError, EpochOrder, first_line

Batch = dict[str, np.ndarray]
IGNORE = -100  # a label with no target (padding; across documents with document_mask)
HELD_OUT_SPLIT = "validation"  # the held-out split cut from the documents by eval_fraction
SPLIT_SEED = 0  # which documents eval_fraction holds out: the same whatever config.train.seed


# --------------------------------------------------------------------------------------------
# Tokenizer and packing.

def load_tokenizer(path: str, key: str = "config.data.tokenizer") -> Any:
    """transformers' ``AutoTokenizer`` of the directory ``path`` (local files only); it must
    have an end-of-text token. Raises ``DataError`` naming ``key`` and ``path``."""
    if not os.path.isdir(path):
        raise DataError(f"{key}={path!r}: tokenizer directory not found")
    from transformers import AutoTokenizer  # lazy: transformers takes a second to import

    try:
        tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    except Exception as e:  # noqa: BLE001 - a malformed or missing file: name the directory
        raise DataError(f"{key}={path!r}: cannot load a tokenizer ({type(e).__name__}: "
                        f"{first_line(e)})") from None
    if tokenizer.eos_token_id is None:
        raise DataError(f"{key}={path!r}: the tokenizer has no end-of-text token (eos_token), "
                        "which separates packed documents: set eos_token in its "
                        "tokenizer_config.json (GPT-2's is '<|endoftext|>', Llama's '</s>')")
    return tokenizer


def separators(tokenizer: Any) -> tuple[list[int], list[int]]:
    """The ids that open and close every document: ``([bos] or [], [eos])``."""
    eos, bos = int(tokenizer.eos_token_id), tokenizer.bos_token_id
    return ([] if bos is None or int(bos) == eos else [int(bos)]), [eos]


def pad_id(tokenizer: Any) -> int:
    pad = tokenizer.pad_token_id
    return int(tokenizer.eos_token_id if pad is None else pad)


@dataclasses.dataclass(frozen=True)
class Packed:
    """A token stream: ``tokens`` int32 ``[T]`` and ``docs`` int32 ``[T]``, each token's
    document (0, 1, ... in order)."""

    tokens: np.ndarray
    docs: np.ndarray

    def num_sequences(self, seq_len: int, *, partial: bool = False) -> int:
        """Full sequences of ``seq_len`` (and a padded last one where ``partial``)."""
        span = max(len(self.tokens) - 1, 0)
        return -(-span // seq_len) if partial else span // seq_len


def pack(tokenizer: Any, documents: Sequence[lm_sources.Document]) -> Packed:
    """The stream of ``documents``: each ``[bos] + tokens + [eos]`` (:func:`separators`)."""
    head, tail = separators(tokenizer)
    encoded = tokenizer([t for _, t in documents], add_special_tokens=False,
                        verbose=False)["input_ids"] if documents else []
    parts = [np.asarray(head + list(ids) + tail, np.int32) for ids in encoded]
    if not parts:
        return Packed(np.zeros(0, np.int32), np.zeros(0, np.int32))
    lengths = [len(p) for p in parts]
    return Packed(np.concatenate(parts),
                  np.repeat(np.arange(len(parts), dtype=np.int32), lengths))


def sequences(packed: Packed, indices: np.ndarray, seq_len: int, *, document_mask: bool,
              pad: int) -> Batch:
    """The batch of sequences ``indices`` of ``packed`` (see the module's docstring)."""
    idx = np.asarray(indices, np.int64)
    pos = idx[:, None] * seq_len + np.arange(seq_len + 1)[None, :]  # [B, L + 1]
    valid = pos < len(packed.tokens)
    at = np.minimum(pos, len(packed.tokens) - 1)
    tokens = np.where(valid, packed.tokens[at], pad).astype(np.int32)
    docs = packed.docs[at]
    target = valid[:, 1:].copy()
    if document_mask:
        target &= docs[:, 1:] == docs[:, :-1]
    out = {"input_ids": tokens[:, :-1],
           "labels": np.where(target, tokens[:, 1:], IGNORE).astype(np.int32),
           "attention_mask": valid[:, :-1].astype(np.int32)}
    if document_mask:
        out["segment_ids"] = (docs[:, :-1] - docs[:, :1] + ~valid[:, :-1]).astype(np.int32)
    return out


def block_causal_mask(segment_ids: np.ndarray, attention_mask: np.ndarray) -> np.ndarray:
    """bool ``[B, L, L]``: query ``q`` may attend to key ``k`` (``k <= q``, same segment, ``k``
    not padding); the reference for a model's document mask."""
    seg = np.asarray(segment_ids)
    length = seg.shape[-1]
    causal = np.tril(np.ones((length, length), bool))[None]
    keys = np.asarray(attention_mask)[:, None, :] > 0
    return causal & (seg[:, :, None] == seg[:, None, :]) & keys


def document_positions(segment_ids: np.ndarray) -> np.ndarray:
    """int32 ``[B, L]``: each token's position within its document's part of the sequence."""
    seg = np.asarray(segment_ids)
    t = np.broadcast_to(np.arange(seg.shape[-1]), seg.shape)
    starts = np.where(np.concatenate([np.ones_like(seg[:, :1], bool), seg[:, 1:] != seg[:, :-1]],
                                     axis=1), t, 0)
    return (t - np.maximum.accumulate(starts, axis=1)).astype(np.int32)


# --------------------------------------------------------------------------------------------
# The corpus of a config.

def _get(config: Any, key: str, default: Any) -> Any:
    try:
        return config.data[key]
    except (KeyError, AttributeError):
        return default


def hold_out(documents: list[lm_sources.Document], fraction: float, where: str
             ) -> tuple[list[lm_sources.Document], list[lm_sources.Document]]:
    """``(training, held-out)``: ``ceil(fraction · n)`` documents chosen by
    ``default_rng(SPLIT_SEED)``, both parts in their original order."""
    n = len(documents)
    count = math.ceil(fraction * n)
    if not 0.0 < fraction < 1.0 or not 1 <= count < n:
        raise DataError(f"config.data.eval_fraction={fraction!r} of the {n} document(s) of "
                        f"{where} leaves no training or no held-out document (a fraction in "
                        "(0, 1), with at least two documents; one .txt file is one document "
                        "unless config.data.txt_documents='paragraph')")
    held = set(np.random.default_rng(SPLIT_SEED).permutation(n)[:count].tolist())
    return ([d for i, d in enumerate(documents) if i not in held],
            [d for i, d in enumerate(documents) if i in held])


Documents = list[lm_sources.Document]


def documents(config: Any) -> tuple[Documents, dict[str, Documents]]:
    """``(training documents, {held-out split: documents})`` of the config's source."""
    name = config.data.name
    column = _get(config, "text_column", "text")
    fraction = float(_get(config, "eval_fraction", 0.0))
    eval_files = tuple(_get(config, "eval_files", ()))
    if eval_files and fraction:
        raise DataError("config.data.eval_files and config.data.eval_fraction are both set: "
                        "hold out a separate file or a fraction, not both")
    if readers.is_hf(name):
        train_split = _get(config, "train_split", "train")
        eval_splits = () if fraction else tuple(_get(config, "eval_splits", ()))
        got = lm_sources.hf_documents(name, (train_split, *eval_splits),
                                      subset=_get(config, "hf_subset", ""), text_column=column)
        train, evals = got[train_split], {s: got[s] for s in eval_splits}
    else:
        kwargs = dict(text_column=column, txt_documents=_get(config, "txt_documents", "file"))
        train = lm_sources.read_documents(name, **kwargs)
        names = [os.path.splitext(os.path.basename(p.rstrip("/")))[0] for p in eval_files]
        names = [s if names.count(s) == 1 else p for s, p in zip(names, eval_files)]
        evals = {s: lm_sources.read_documents(p, key="config.data.eval_files", **kwargs)
                 for s, p in zip(names, eval_files)}
    if fraction:
        train, held = hold_out(train, fraction, name)
        evals = {HELD_OUT_SPLIT: held}
    return train, evals


@dataclasses.dataclass
class Corpus:
    tokenizer: Any
    train: Packed
    evals: dict[str, Packed]
    pad: int


_CACHE: dict[tuple, Corpus] = {}


def _stamp(paths: Sequence[str]) -> tuple:
    files = [f for p in paths for f in (lm_sources.txt_files(p) if os.path.isdir(p) else [p])]
    return tuple((f, os.path.getmtime(f), os.path.getsize(f)) for f in files if os.path.isfile(f))


def load(config: Any) -> Corpus:
    """The config's corpus, read, tokenised and packed once per process (while its files and
    the keys that shape it are unchanged); raises ``DataError``."""
    found = text.tokenizer_dir(config)
    if found is None:
        raise DataError(f"config.data.name={config.data.name!r} needs a tokenizer: set "
                        "config.data.tokenizer (or config.model.pretrained) to a Hugging Face "
                        "tokenizer directory")
    keys = ("name", "text_column", "txt_documents", "eval_files", "eval_fraction", "hf_subset",
            "train_split", "eval_splits")
    values = tuple(str(_get(config, k, None)) for k in keys)
    sources = [config.data.name, *_get(config, "eval_files", ())]
    key = (values, found, _stamp([p for p in sources if not readers.is_hf(p)] + [found[1]]))
    corpus = _CACHE.get(key)
    if corpus is None:
        tokenizer = load_tokenizer(found[1], found[0])
        train_docs, eval_docs = documents(config)
        corpus = Corpus(tokenizer, pack(tokenizer, train_docs),
                        {s: pack(tokenizer, d) for s, d in eval_docs.items()}, pad_id(tokenizer))
        _CACHE[key] = corpus
    vocab, _, _, where = text.model_shape(config)  # (checked on every call: the model may change)
    for split, packed in [("training", corpus.train), *corpus.evals.items()]:
        high = int(max(packed.tokens.max(initial=0), corpus.pad))
        if high >= vocab:
            raise DataError(f"{found[0]}={found[1]!r}: token id {high} ({split} text of "
                            f"{config.data.name}) is outside the model's vocabulary of {vocab} "
                            f"({where})")
    return corpus


def train_batch_fn(config: Any) -> Callable[[int], Batch]:
    """``make(i)``: training batch ``i`` (the corpus is read, tokenised and checked now, so that
    its errors are raised by this call)."""
    corpus = load(config)
    seq_len, batch_size = int(config.data.seq_len), int(config.data.batch_size)
    document_mask = bool(_get(config, "document_mask", False))
    n = corpus.train.num_sequences(seq_len)
    if n < 1:
        raise DataError(f"{config.data.name}: its training text is {len(corpus.train.tokens)} "
                        f"tokens, fewer than config.data.seq_len + 1 = {seq_len + 1}: too short "
                        "for one sequence")
    order = EpochOrder(config.train.seed, n)
    train, pad = corpus.train, corpus.pad

    def make(i: int) -> Batch:
        return sequences(train, order.indices(i * batch_size, batch_size), seq_len,
                         document_mask=document_mask, pad=pad)

    return make


def train_batches(config: Any, start_step: int = 0) -> Prefetcher:
    """Training batches for steps ``start_step, start_step + 1, ...`` (endless), built ahead by
    a :class:`~skyjax.data.prefetch.Prefetcher` (``config.data.prefetch`` deep), as
    :func:`skyjax.data.train_batches` builds every source's."""
    return Prefetcher(train_batch_fn(config), start=start_step,
                      depth=int(_get(config, "prefetch", 2)), name="skyjax-data-lm-text")


def eval_split_batches(config: Any, splits: Sequence[str] | None = None
                       ) -> dict[str, list[Batch]]:
    """``{split: batches}`` of the held-out splits (all, or ``splits``), each its first
    ``config.data.eval_examples`` sequences (-1: all; 0: ``{}``) in order, in batches of
    ``config.data.batch_size``; the last batch is filled up with the split's first sequences,
    ``weights`` 0 and no targets."""
    count_cap = int(config.data.eval_examples)
    if count_cap == 0:
        return {}
    corpus = load(config)
    seq_len, batch_size = int(config.data.seq_len), int(config.data.batch_size)
    document_mask = bool(_get(config, "document_mask", False))
    out = {}
    for split in (corpus.evals if splits is None else splits):
        if split not in corpus.evals:
            raise DataError(f"{config.data.name}: no held-out split {split!r} (it has "
                            f"{', '.join(map(repr, corpus.evals)) or 'none'})")
        packed = corpus.evals[split]
        n = packed.num_sequences(seq_len, partial=True)
        if n < 1:
            raise DataError(f"{config.data.name}: held-out split {split!r} has "
                            f"{len(packed.tokens)} token(s), too few for one target")
        count = n if count_cap < 0 else min(count_cap, n)
        batches = []
        for b in range(math.ceil(count / batch_size)):
            pos = np.arange(b * batch_size, (b + 1) * batch_size)
            batch = sequences(packed, pos % count, seq_len, document_mask=document_mask,
                              pad=corpus.pad)
            real = pos < count
            batch["labels"][~real] = IGNORE
            batch["weights"] = real.astype(np.float32)
            batches.append(batch)
        out[split] = batches
    return out
