"""The loss maths (skyjax/metrics.py) against PyTorch's, as Hugging Face's
BertForSequenceClassification applies them: cross-entropy for a classifier, mean squared error
for a one-output (regression) head; and the per-example eval outputs."""

from __future__ import annotations

import numpy as np
import pytest

from skyjax import metrics

torch = pytest.importorskip("torch")

RNG = np.random.default_rng(0)


def test_a_classifier_is_trained_with_cross_entropy():
    logits = RNG.normal(size=(6, 3)).astype(np.float32)
    labels = np.array([0, 2, 1, 1, 0, 2], np.int32)
    loss, accuracy = metrics.classification_loss(logits, labels)
    want = torch.nn.functional.cross_entropy(torch.tensor(logits), torch.tensor(labels).long())
    assert float(loss) == pytest.approx(float(want), rel=1e-6)
    assert float(accuracy) == pytest.approx(np.mean(logits.argmax(-1) == labels))


def test_a_one_output_head_is_a_regression_with_mean_squared_error():
    logits = RNG.normal(size=(5, 1)).astype(np.float32)
    labels = RNG.uniform(0, 5, 5).astype(np.float32)
    loss, accuracy = metrics.classification_loss(logits, labels)
    want = torch.nn.MSELoss()(torch.tensor(logits).squeeze(), torch.tensor(labels).squeeze())
    assert float(loss) == pytest.approx(float(want), rel=1e-6)
    assert float(accuracy) == 0.0  # a regression has no accuracy


def test_eval_outputs_are_per_example():
    logits = RNG.normal(size=(4, 2)).astype(np.float32)
    labels = np.array([1, 0, 1, 1], np.int32)
    weights = np.array([1, 1, 1, 0], np.float32)
    loss, pred, label, weight = metrics.eval_outputs(logits, labels, weights)
    want = torch.nn.functional.cross_entropy(torch.tensor(logits), torch.tensor(labels).long(),
                                             reduction="none")
    np.testing.assert_allclose(loss, want.numpy(), rtol=1e-6)
    np.testing.assert_array_equal(pred, logits.argmax(-1))
    np.testing.assert_array_equal(label, labels)
    np.testing.assert_array_equal(weight, weights)
    value = RNG.normal(size=(3, 1)).astype(np.float32)
    target = np.array([0.5, 1.0, 2.0], np.float32)
    loss, pred, _, _ = metrics.eval_outputs(value, target, np.ones(3, np.float32))
    np.testing.assert_allclose(pred, value[:, 0])
    np.testing.assert_allclose(loss, (value[:, 0] - target) ** 2, rtol=1e-6)


def test_a_language_model_is_trained_with_next_token_cross_entropy_ignoring_minus_100():
    """Logits [batch, seq, vocab] against shifted labels: PyTorch's cross-entropy with
    ignore_index=-100 (Hugging Face's causal-LM loss), mean over the target tokens; eval gives
    per sequence (NLL sum, correct tokens, targets, weight)."""
    logits = RNG.normal(size=(3, 5, 7)).astype(np.float32)
    labels = RNG.integers(0, 7, (3, 5)).astype(np.int32)
    labels[0, 2:] = -100
    labels[2, 0] = -100
    loss, accuracy = metrics.classification_loss(logits, labels)
    flat = torch.tensor(logits).reshape(-1, 7), torch.tensor(labels).reshape(-1).long()
    want = torch.nn.functional.cross_entropy(*flat, ignore_index=-100)
    assert float(loss) == pytest.approx(float(want), rel=1e-6)
    target = labels != -100
    assert float(accuracy) == pytest.approx(np.mean((logits.argmax(-1) == labels)[target]))
    nll, hit, count, weight = metrics.eval_outputs(logits, labels, np.array([1, 1, 0], np.float32))
    per_token = torch.nn.functional.cross_entropy(*flat, ignore_index=-100, reduction="none")
    np.testing.assert_allclose(nll, per_token.numpy().reshape(3, 5).sum(-1), rtol=1e-6)
    np.testing.assert_array_equal(count, target.sum(-1))
    np.testing.assert_array_equal(hit, ((logits.argmax(-1) == labels) & target).sum(-1))
    np.testing.assert_array_equal(weight, [1, 1, 0])
