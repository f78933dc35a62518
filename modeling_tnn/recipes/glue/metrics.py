"""GLUE metrics through ``evaluate`` (a metric module shipped with the package, so no Hub download), the
classification and regression metrics (scikit-learn, scipy) behind it and behind data files without a task, the
``compute_metrics`` of the Trainer, and the majority-class baseline."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from .tasks import GlueTask, get_task

if TYPE_CHECKING:
    import evaluate

FILE_METRICS = {"classification": ("accuracy",), "regression": ("mse",)}
# The evaluate metric module of the GLUE tasks (``evaluate.load`` takes a local script's path).
GLUE_METRIC_MODULE = Path(__file__).with_name("glue_evaluate_module.py")


def metric_values(metrics: Sequence[str], predictions: Sequence, references: Sequence) -> dict[str, float]:
    """The named metrics (``accuracy``, ``f1``, ``matthews_correlation``, ``pearson``, ``spearmanr``, ``mse``) of
    ``predictions`` against ``references``: GLUE's definitions (F1 of the positive class)."""
    from scipy.stats import pearsonr, spearmanr
    from sklearn.metrics import f1_score, matthews_corrcoef

    predictions, references = np.asarray(predictions), np.asarray(references)
    if predictions.shape != references.shape or predictions.ndim != 1:
        raise ValueError(f"predictions and references must be 1-D of the same length, got shapes "
                         f"{predictions.shape} and {references.shape}.")
    result: dict[str, float] = {}
    for metric in metrics:
        if metric == "accuracy":
            result[metric] = float((predictions == references).mean())
        elif metric == "f1":
            result[metric] = float(f1_score(references, predictions))
        elif metric == "matthews_correlation":
            result[metric] = float(matthews_corrcoef(references, predictions))
        elif metric == "pearson":
            result[metric] = float(pearsonr(predictions, references)[0])
        elif metric == "spearmanr":
            result[metric] = float(spearmanr(predictions, references)[0])
        elif metric == "mse":
            result[metric] = float(np.mean((predictions.astype(np.float64) - references) ** 2))
        else:  # a typo in the task table
            raise ValueError(f"Unknown GLUE metric {metric!r}.")
    return result


def with_combined_score(result: dict[str, float]) -> dict[str, float]:
    """``result`` plus ``combined_score``, the mean of its values, when there are several (run_glue.py's key)."""
    if len(result) > 1:
        result = {**result, "combined_score": float(np.mean(list(result.values())))}
    return result


def score_predictions(metrics: Sequence[str], predictions: Sequence, references: Sequence) -> dict[str, float]:
    """:func:`metric_values`, plus ``combined_score`` (their mean) when there are several."""
    return with_combined_score(metric_values(metrics, predictions, references))


def load_glue_metric(task: GlueTask | str, from_hub: bool = False, **kwargs: Any) -> evaluate.EvaluationModule:
    """GLUE's metric of ``task`` as an ``evaluate.EvaluationModule``: ``compute(predictions=..., references=...)``
    gives the official definitions under the keys of the Hub's ``glue`` metric (CoLA ``matthews_correlation``; MRPC
    and QQP ``accuracy`` and ``f1``; STS-B ``pearson`` and ``spearmanr``; the rest ``accuracy``).

    By default the module shipped with the package (:data:`GLUE_METRIC_MODULE`), which loads offline;
    ``from_hub=True`` loads the Hub's ``glue`` metric instead (``evaluate.load("glue", task)``, online).
    ``kwargs`` go to ``evaluate.load`` (``cache_dir``, ``experiment_id``, ...).
    """
    import evaluate  # the train extra (modeling_tnn.recipes checks it is installed)

    name = (get_task(task) if isinstance(task, str) else task).name
    return evaluate.load("glue" if from_hub else str(GLUE_METRIC_MODULE), name, **kwargs)


def glue_metrics(task: GlueTask | str, predictions: Sequence, references: Sequence) -> dict[str, float]:
    """The official GLUE metrics of ``task`` for class-id (or, for STS-B, score) ``predictions``.

    Keys follow ``evaluate``'s ``glue`` metric (``accuracy``, ``f1``, ``matthews_correlation``, ``pearson``,
    ``spearmanr``), plus ``combined_score`` (their mean) when there are several.
    """
    task = get_task(task) if isinstance(task, str) else task
    return with_combined_score(load_glue_metric(task).compute(predictions=predictions, references=references))


def make_compute_metrics(task: GlueTask | str | None, regression: bool = False) -> Callable:
    """A ``compute_metrics`` for ``Trainer``: argmax of the logits (squeeze for regression), then the task's
    ``evaluate`` metric (:func:`load_glue_metric`) plus ``combined_score``; with ``task=None`` (data files without a GLUE task) the :data:`FILE_METRICS` of a
    classification or (``regression=True``) regression problem."""
    task = get_task(task) if isinstance(task, str) else task
    if task is not None:
        regression = task.is_regression
    glue_metric = load_glue_metric(task) if task is not None else None
    file_metrics = FILE_METRICS["regression" if regression else "classification"]

    def compute_metrics(eval_prediction) -> dict[str, float]:
        logits = eval_prediction.predictions
        logits = logits[0] if isinstance(logits, tuple) else logits
        predictions = np.squeeze(logits, axis=-1) if regression else np.argmax(logits, axis=-1)
        if glue_metric is None:
            return score_predictions(file_metrics, predictions, eval_prediction.label_ids)
        return with_combined_score(glue_metric.compute(predictions=predictions, references=eval_prediction.label_ids))

    return compute_metrics


def main_metric(task: GlueTask | str) -> str:
    """The metric reported for ``task`` in a one-number-per-task table (``combined_score`` when there are several)."""
    task = get_task(task) if isinstance(task, str) else task
    return task.metrics[0] if len(task.metrics) == 1 else "combined_score"


def majority_baseline(task: GlueTask | str, train_labels: Sequence, eval_labels: Sequence) -> dict[str, float]:
    """The metrics of always predicting the most frequent training class (for STS-B, the mean training score,
    whose correlations are undefined: ``nan``)."""
    task = get_task(task) if isinstance(task, str) else task
    train_labels, eval_labels = np.asarray(train_labels), np.asarray(eval_labels)
    if task.is_regression:
        return {metric: float("nan") for metric in task.metrics} | (
            {"combined_score": float("nan")} if len(task.metrics) > 1 else {})
    constant = np.bincount(train_labels.astype(int), minlength=task.num_labels).argmax()
    return glue_metrics(task, np.full_like(eval_labels, constant), eval_labels)
