"""Held-out metrics (skyjax/scores.py) against scikit-learn's and SciPy's on fixed predictions,
and the summary of per-example eval outputs (padding left out)."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from skyjax import scores

sklearn_metrics = pytest.importorskip("sklearn.metrics")  # the "test" extra installs it

RNG = np.random.default_rng(7)
CLASSIFICATION = [  # (predictions, labels)
    (RNG.integers(0, 2, 50), RNG.integers(0, 2, 50)),
    (RNG.integers(0, 3, 40), RNG.integers(0, 3, 40)),
    (np.array([1, 1, 0, 1, 0, 0, 1]), np.array([1, 0, 0, 1, 1, 0, 1])),
    (np.ones(6, int), np.array([0, 1, 0, 1, 1, 0])),  # a constant prediction
    (np.zeros(5, int), np.zeros(5, int)),  # one class only
]


@pytest.mark.parametrize("pred,label", CLASSIFICATION)
def test_classification_metrics_equal_scikit_learn(pred, label):
    assert scores.accuracy(pred, label) == pytest.approx(
        sklearn_metrics.accuracy_score(label, pred))
    assert scores.matthews(pred, label) == pytest.approx(
        sklearn_metrics.matthews_corrcoef(label, pred), abs=1e-12)
    if max(pred.max(), label.max()) <= 1:
        assert scores.f1(pred, label) == pytest.approx(
            sklearn_metrics.f1_score(label, pred, zero_division=0.0))


REGRESSION = [
    (RNG.normal(size=30), RNG.normal(size=30)),
    (np.array([0.0, 1.0, 1.0, 2.5, 2.5, 2.5, 4.0]), np.array([0.2, 0.8, 1.5, 1.5, 3.0, 2.0, 5.0])),
    (np.round(RNG.uniform(0, 5, 40), 0), np.round(RNG.uniform(0, 5, 40), 1)),  # many ties
]


@pytest.mark.parametrize("pred,label", REGRESSION)
def test_correlations_equal_scipy(pred, label):
    assert scores.pearson(pred, label) == pytest.approx(stats.pearsonr(pred, label)[0])
    assert scores.spearman(pred, label) == pytest.approx(stats.spearmanr(pred, label)[0])
    np.testing.assert_allclose(scores.average_ranks(pred), stats.rankdata(pred))


def test_an_undefined_correlation_is_zero_not_nan():
    assert scores.pearson(np.ones(4), np.arange(4.0)) == 0.0
    assert scores.spearman(np.arange(4.0), np.full(4, 2.0)) == 0.0


def test_summarize_leaves_padding_out_and_reports_the_metric():
    # two batches of 4; the last two rows of the second pad it (weight 0)
    loss = [np.array([1.0, 2.0, 3.0, 4.0]), np.array([5.0, 6.0, 99.0, 99.0])]
    pred = [np.array([1, 0, 1, 1]), np.array([0, 1, 1, 1])]
    label = [np.array([1, 0, 0, 1]), np.array([1, 1, 0, 0])]
    weight = [np.ones(4), np.array([1.0, 1.0, 0.0, 0.0])]
    results = list(zip(loss, pred, label, weight))
    out = scores.summarize(results, "f1")
    p, y = np.array([1, 0, 1, 1, 0, 1]), np.array([1, 0, 0, 1, 1, 1])
    assert out["eval_examples"] == 6
    assert out["eval_loss"] == pytest.approx(3.5)
    assert out["eval_accuracy"] == pytest.approx(sklearn_metrics.accuracy_score(y, p))
    assert out["eval_f1"] == pytest.approx(sklearn_metrics.f1_score(y, p))
    assert set(scores.summarize(results, "matthews")) == {"eval_loss", "eval_examples",
                                                          "eval_accuracy", "eval_matthews"}
    assert set(scores.summarize(results, "pearson_spearman")) == {
        "eval_loss", "eval_examples", "eval_pearson", "eval_spearman"}
    assert scores.summarize([], "accuracy") == {}
    assert scores.summarize([(np.ones(2), np.ones(2), np.ones(2), np.zeros(2))], "accuracy") == {}


def test_a_metric_must_fit_the_head():
    scores.check_metric("matthews", 2)
    scores.check_metric("pearson_spearman", 1)
    with pytest.raises(ValueError, match=r"config.data.metric='pearson_spearman' does not fit "
                                         r"config.model.num_labels=3"):
        scores.check_metric("pearson_spearman", 3)
    with pytest.raises(ValueError, match=r"config.data.metric='f1' does not fit"):
        scores.check_metric("f1", 1)
    with pytest.raises(ValueError, match=r"config.data.metric='auc' is not one of"):
        scores.check_metric("auc", 2)


def test_a_language_models_summary_is_token_weighted_perplexity():
    """Per sequence (NLL sum, correct tokens, targets, weight): padding rows left out, the loss
    per target token, its exponential, the token accuracy."""
    results = [(np.array([6.0, 2.0]), np.array([1, 2]), np.array([3, 1]), np.ones(2)),
               (np.array([4.0, 50.0]), np.array([0, 9]), np.array([4, 9]), np.array([1.0, 0]))]
    out = scores.summarize(results, "perplexity")
    assert out["eval_loss"] == pytest.approx(12.0 / 8)
    assert out["eval_perplexity"] == pytest.approx(np.exp(1.5))
    assert out["eval_tokens"] == 8 and out["eval_examples"] == 3
    assert out["eval_accuracy"] == pytest.approx(3 / 8)
    scores.check_metric("perplexity", 3)  # a language model's; config.data's checks hold it
