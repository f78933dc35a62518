"""Classification and regression metrics (scikit-learn, scipy) for GLUE tasks and data files, the ``compute_metrics``
of the Trainer, and the majority-class baseline."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from .tasks import GlueTask, get_task

FILE_METRICS = {"classification": ("accuracy",), "regression": ("mse",)}


def score_predictions(metrics: Sequence[str], predictions: Sequence, references: Sequence) -> dict[str, float]:
    """The named metrics (``accuracy``, ``f1``, ``matthews_correlation``, ``pearson``, ``spearmanr``, ``mse``) of
    ``predictions`` against ``references``, plus ``combined_score`` (their mean) when there are several."""
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
    if len(result) > 1:
        result["combined_score"] = float(np.mean(list(result.values())))
    return result


def glue_metrics(task: GlueTask | str, predictions: Sequence, references: Sequence) -> dict[str, float]:
    """The official GLUE metrics of ``task`` for class-id (or, for STS-B, score) ``predictions``.

    Keys follow ``evaluate``'s ``glue`` metric (``accuracy``, ``f1``, ``matthews_correlation``, ``pearson``,
    ``spearmanr``), plus ``combined_score`` (their mean) when there are several.
    """
    task = get_task(task) if isinstance(task, str) else task
    return score_predictions(task.metrics, predictions, references)


def make_compute_metrics(task: GlueTask | str | None, regression: bool = False) -> Callable:
    """A ``compute_metrics`` for ``Trainer``: argmax of the logits (squeeze for regression), then
    :func:`glue_metrics`; with ``task=None`` (data files without a GLUE task) the :data:`FILE_METRICS` of a
    classification or (``regression=True``) regression problem."""
    task = get_task(task) if isinstance(task, str) else task
    if task is not None:
        regression = task.is_regression
    metrics = task.metrics if task is not None else FILE_METRICS["regression" if regression else "classification"]

    def compute_metrics(eval_prediction) -> dict[str, float]:
        logits = eval_prediction.predictions
        logits = logits[0] if isinstance(logits, tuple) else logits
        predictions = np.squeeze(logits, axis=-1) if regression else np.argmax(logits, axis=-1)
        return score_predictions(metrics, predictions, eval_prediction.label_ids)

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
