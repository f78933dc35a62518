"""GLUE metrics through ``evaluate``: the metric module shipped in the package loads offline, gives GLUE's official
definitions (equal to scikit-learn/scipy), is what the GLUE recipe's ``compute_metrics`` uses, and ``from_hub=True``
asks the Hub's ``glue`` metric instead."""

from __future__ import annotations

import socket

import numpy as np
import pytest

evaluate = pytest.importorskip("evaluate")
from scipy.stats import pearsonr, spearmanr  # noqa: E402
from sklearn.metrics import accuracy_score, f1_score, matthews_corrcoef  # noqa: E402
from transformers import EvalPrediction  # noqa: E402

from modeling_tnn.recipes.glue import metrics as glue_metrics  # noqa: E402
from modeling_tnn.recipes.glue.tasks import TASK_NAMES, get_task  # noqa: E402


def _official(task: str, predictions: np.ndarray, references: np.ndarray) -> dict[str, float]:
    """GLUE's definitions, written out with scikit-learn and scipy."""
    if task == "cola":
        return {"matthews_correlation": matthews_corrcoef(references, predictions)}
    if task in ("mrpc", "qqp"):
        return {"accuracy": accuracy_score(references, predictions), "f1": f1_score(references, predictions)}
    if task == "stsb":
        return {"pearson": pearsonr(predictions, references)[0], "spearmanr": spearmanr(predictions, references)[0]}
    return {"accuracy": accuracy_score(references, predictions)}


def _sample(task: str, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    if get_task(task).is_regression:
        references = rng.uniform(0, 5, 64)
        return references + rng.normal(0, 1, 64), references
    classes = get_task(task).num_labels
    return rng.integers(0, classes, 64), rng.integers(0, classes, 64)


@pytest.fixture
def no_network(monkeypatch):
    """Any connection attempt fails: the local module must load and compute without one."""
    def refuse(*args, **kwargs):
        raise OSError("network access in an offline test")

    monkeypatch.setattr(socket.socket, "connect", refuse)


@pytest.mark.parametrize("task", TASK_NAMES)
def test_the_shipped_module_gives_glue_s_definitions_offline(task, no_network):
    metric = glue_metrics.load_glue_metric(task)
    assert isinstance(metric, evaluate.EvaluationModule)
    predictions, references = _sample(task, np.random.default_rng(0))
    result = metric.compute(predictions=predictions, references=references)
    expected = _official(task, predictions, references)
    assert set(result) == set(expected)
    for key, value in expected.items():
        assert result[key] == pytest.approx(value, rel=1e-6, abs=1e-9), key


def test_an_unknown_task_is_refused_by_name():
    with pytest.raises(ValueError, match="Unknown GLUE task 'sst3'"):
        glue_metrics.load_glue_metric("sst3")


def test_compute_metrics_goes_through_the_evaluate_module(monkeypatch):
    loaded = []
    load = glue_metrics.load_glue_metric

    def recording(task, **kwargs):
        loaded.append(task.name)
        return load(task, **kwargs)

    monkeypatch.setattr(glue_metrics, "load_glue_metric", recording)
    logits = np.array([[2.0, -1.0], [0.1, 0.3], [5.0, 4.0], [-1.0, 1.0], [0.0, 1.0]])  # argmax 0, 1, 0, 1, 1
    labels = np.array([0, 1, 1, 1, 0])
    result = glue_metrics.make_compute_metrics("mrpc")(EvalPrediction(predictions=logits, label_ids=labels))
    accuracy, f1 = 3 / 5, f1_score(labels, [0, 1, 0, 1, 1])
    assert loaded == ["mrpc"]
    assert result == pytest.approx({"accuracy": accuracy, "f1": f1, "combined_score": (accuracy + f1) / 2})


def test_from_hub_asks_evaluate_for_the_hub_s_glue_metric(monkeypatch):
    calls = []
    monkeypatch.setattr(evaluate, "load", lambda *args, **kwargs: calls.append((args, kwargs)) or "hub module")
    assert glue_metrics.load_glue_metric("SST-2", from_hub=True, cache_dir="c") == "hub module"
    assert calls == [(("glue", "sst2"), {"cache_dir": "c"})]
