"""Held-out scores on the host, in numpy: GLUE's published metrics, one definition each.

A task names its metric (:data:`METRICS`): ``accuracy``; ``matthews`` (Matthews correlation, CoLA);
``f1`` (binary F1 of class 1 and accuracy, MRPC and QQP); ``pearson_spearman`` (Pearson and
Spearman correlation of a regression, STS-B). Every eval also reports its mean loss and example
count. The definitions are scikit-learn's and SciPy's (``matthews_corrcoef``, ``f1_score``,
``pearsonr``, ``spearmanr`` with average ranks for ties), which the tests check them against;
a correlation that is undefined (a constant prediction or label) is 0.0, as scikit-learn's MCC
returns, rather than NaN, so that summaries stay valid JSON.

A language model's held-out figures are the mean token NLL and the perplexity
(:func:`perplexity`).

This module imports numpy only.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

import numpy as np

METRICS = ("accuracy", "matthews", "f1", "pearson_spearman", "perplexity")
REGRESSION_METRICS = ("pearson_spearman",)
LM_METRICS = ("perplexity",)  # a causal language model's (its only one)


def accuracy(predictions: np.ndarray, labels: np.ndarray) -> float:
    return float(np.mean(np.asarray(predictions) == np.asarray(labels)))


def matthews(predictions: np.ndarray, labels: np.ndarray) -> float:
    """Matthews correlation of a multi-class prediction (scikit-learn's ``matthews_corrcoef``)."""
    classes, y = np.unique(np.concatenate([labels, predictions]), return_inverse=True)
    true, pred = y[:len(labels)], y[len(labels):]
    k = len(classes)
    confusion = np.zeros((k, k), np.float64)
    np.add.at(confusion, (true, pred), 1.0)
    t, p = confusion.sum(axis=1), confusion.sum(axis=0)
    n, correct = confusion.sum(), np.trace(confusion)
    cov_yp = correct * n - t @ p
    cov_yy = n * n - t @ t
    cov_pp = n * n - p @ p
    if cov_yy * cov_pp == 0:
        return 0.0
    return float(cov_yp / np.sqrt(cov_yy * cov_pp))


def f1(predictions: np.ndarray, labels: np.ndarray, positive: int = 1) -> float:
    """Binary F1 of class ``positive`` (scikit-learn's ``f1_score``; 0.0 with no positives)."""
    pred, true = np.asarray(predictions) == positive, np.asarray(labels) == positive
    tp = float(np.sum(pred & true))
    denominator = float(np.sum(pred) + np.sum(true))
    return 2.0 * tp / denominator if denominator else 0.0


def pearson(x: np.ndarray, y: np.ndarray) -> float:
    x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
    dx, dy = x - x.mean(), y - y.mean()
    denominator = np.sqrt(np.sum(dx * dx) * np.sum(dy * dy))
    return float(np.sum(dx * dy) / denominator) if denominator else 0.0


def average_ranks(x: np.ndarray) -> np.ndarray:
    """Ranks 1..n, ties given their mean rank (SciPy's ``rankdata(method="average")``)."""
    x = np.asarray(x)
    order = np.argsort(x, kind="stable")
    sorted_x = x[order]
    starts = np.flatnonzero(np.r_[True, sorted_x[1:] != sorted_x[:-1]])
    ends = np.r_[starts[1:], len(x)]
    ranks = np.empty(len(x), np.float64)
    for s, e in zip(starts, ends):
        ranks[order[s:e]] = (s + e + 1) / 2.0
    return ranks


def spearman(x: np.ndarray, y: np.ndarray) -> float:
    return pearson(average_ranks(x), average_ranks(y))


def check_metric(metric: str, num_labels: int, key: str = "config.data.metric") -> None:
    """Raises ``ValueError`` naming ``key`` when ``metric`` does not fit the head's label count
    (a correlation needs a regression head, ``num_labels == 1``, and the others a classifier)."""
    if metric not in METRICS:
        raise ValueError(f"{key}={metric!r} is not one of {', '.join(map(repr, METRICS))}")
    if metric in LM_METRICS:
        return  # a language model's; config.data's checks hold it to one
    if (metric in REGRESSION_METRICS) != (num_labels == 1):
        raise ValueError(f"{key}={metric!r} does not fit config.model.num_labels={num_labels} "
                         "(pearson_spearman needs a regression head, num_labels=1; the other "
                         "metrics a classifier, num_labels >= 2)")


def score(metric: str, predictions: np.ndarray, labels: np.ndarray) -> dict[str, float]:
    """The ``metric``'s figures for these predictions (class ids, or regression values)."""
    if metric == "pearson_spearman":
        return {"pearson": pearson(predictions, labels), "spearman": spearman(predictions, labels)}
    out = {"accuracy": accuracy(predictions, labels)}
    if metric == "matthews":
        out["matthews"] = matthews(predictions, labels)
    elif metric == "f1":
        out["f1"] = f1(predictions, labels)
    return out


def summarize(results: Iterable[Sequence[np.ndarray]], metric: str) -> dict[str, float]:
    """``eval_loss``, ``eval_examples`` and ``eval_<figure>`` for every figure of ``metric``,
    from per-batch ``(loss, prediction, label, weight)`` arrays (one entry per example; rows of
    weight 0 pad the last batch and are left out). ``{}`` when there were no examples.
    ``perplexity`` (a language model): per sequence ``(NLL sum, correct next tokens, target
    tokens, weight)`` (:func:`skyjax.metrics.eval_outputs`), scored by :func:`perplexity` and the
    token accuracy."""
    parts = [tuple(np.asarray(a).reshape(-1) for a in r) for r in results]
    if not parts:
        return {}
    loss, pred, label, weight = (np.concatenate([p[i] for p in parts]) for i in range(4))
    keep = weight > 0
    if not keep.any():
        return {}
    if metric in LM_METRICS:  # per sequence (NLL sum, correct next tokens, targets, weight)
        out = perplexity(loss[keep], label[keep])
        if out:
            out.update(eval_examples=int(keep.sum()),
                       eval_accuracy=float(np.sum(pred[keep]) / np.sum(label[keep])))
        return out
    out = {"eval_loss": float(np.sum(loss[keep] * weight[keep]) / np.sum(weight[keep])),
           "eval_examples": int(keep.sum())}
    out.update({f"eval_{k}": v for k, v in score(metric, pred[keep], label[keep]).items()})
    return out


def perplexity(nll: np.ndarray, tokens: np.ndarray) -> dict[str, float]:
    """A language model's held-out figures, token-weighted: ``eval_loss`` the mean negative
    log-likelihood per target token (nats), ``eval_perplexity`` its exponential and
    ``eval_tokens`` the number of target tokens. ``nll[i]`` is the summed NLL of entry ``i``'s
    ``tokens[i]`` targets: an entry is a sequence (its NLL sum and target count) or one position
    (its NLL and 1, or 0 where it has no target); entries of 0 targets are left out, whatever
    their NLL. ``{}`` when there are no targets."""
    nll, tokens = np.asarray(nll, np.float64).reshape(-1), np.asarray(tokens).reshape(-1)
    keep = tokens > 0
    count = float(np.sum(tokens[keep]))
    if not count:
        return {}
    mean = float(np.sum(nll[keep]) / count)
    try:
        ppl = math.exp(mean)
    except OverflowError:  # a mean NLL above ~709 nats
        ppl = float("inf")
    return {"eval_loss": mean, "eval_perplexity": ppl, "eval_tokens": int(count)}
