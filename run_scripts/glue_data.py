"""The GLUE task table, loading of the official GLUE tsv files, and the official GLUE metrics (offline).

Everything task-specific lives here, once: ``finetune_glue.py`` and ``run_glue_suite.py`` import it, and the tests
check it. The metrics follow the definitions of the official GLUE metric (``evaluate``'s ``glue`` module, which
needs the Hub at run time) with scikit-learn and scipy: accuracy; accuracy and binary F1 for MRPC and QQP;
Matthews correlation for CoLA; Pearson and Spearman correlation for STS-B; plus ``combined_score``, their mean,
where a task has several (as HF's ``run_glue.py`` does).

Local data uses the folder layout written by the official ``download_glue_data.py`` (``CoLA/train.tsv``,
``SST-2/dev.tsv``, ``MNLI/dev_matched.tsv``, ...). Quirks handled here: CoLA has no header line, MRPC starts with a
UTF-8 BOM, and fields are tab-separated with no quoting (quotes are part of the text).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

logger = logging.getLogger(__name__)

# Malformed rows (too few fields, an unknown label) are skipped with a warning up to this fraction of a file;
# beyond it the file is taken to be the wrong file and loading fails.
MAX_BAD_ROW_FRACTION = 0.01


@dataclass(frozen=True)
class GlueTask:
    """One GLUE task: where its files are, which tsv columns hold what, its labels and its metrics.

    ``text_columns`` are the column names of the Hub dataset ``nyu-mll/glue`` (and of the datasets built here);
    ``file_text_columns`` / ``file_label_column`` are the header names in the official tsv files (for CoLA, which
    has no header, ``headerless_columns`` names its four fields). ``file_labels[i]`` is how label ``i`` is written
    in the tsv file; ``label_names`` are the Hub dataset's class names. Regression tasks have neither.
    """

    name: str
    folder: str
    text_columns: tuple[str, ...]
    file_text_columns: tuple[str, ...]
    file_label_column: str
    label_names: tuple[str, ...] | None
    file_labels: tuple[str, ...] | None
    metrics: tuple[str, ...]
    eval_files: dict[str, str] = field(default_factory=lambda: {"validation": "dev.tsv"})
    headerless_columns: tuple[str, ...] | None = None

    @property
    def is_regression(self) -> bool:
        return self.label_names is None

    @property
    def num_labels(self) -> int:
        return 1 if self.label_names is None else len(self.label_names)

    @property
    def eval_splits(self) -> tuple[str, ...]:
        """Names of the evaluation splits (``validation``, or MNLI's matched and mismatched)."""
        return tuple(self.eval_files)

    def split_files(self) -> dict[str, str]:
        """File name of every split with labels: ``{"train": "train.tsv", "validation": "dev.tsv", ...}``."""
        return {"train": "train.tsv", **self.eval_files}


_BINARY = ("0", "1")
_NLI2 = ("entailment", "not_entailment")

GLUE_TASKS: dict[str, GlueTask] = {
    task.name: task
    for task in (
        GlueTask("cola", "CoLA", ("sentence",), ("sentence",), "label", ("unacceptable", "acceptable"), _BINARY,
                 ("matthews_correlation",), headerless_columns=("source", "label", "original_label", "sentence")),
        GlueTask("sst2", "SST-2", ("sentence",), ("sentence",), "label", ("negative", "positive"), _BINARY,
                 ("accuracy",)),
        GlueTask("mrpc", "MRPC", ("sentence1", "sentence2"), ("#1 String", "#2 String"), "Quality",
                 ("not_equivalent", "equivalent"), _BINARY, ("accuracy", "f1")),
        GlueTask("qqp", "QQP", ("question1", "question2"), ("question1", "question2"), "is_duplicate",
                 ("not_duplicate", "duplicate"), _BINARY, ("accuracy", "f1")),
        GlueTask("stsb", "STS-B", ("sentence1", "sentence2"), ("sentence1", "sentence2"), "score", None, None,
                 ("pearson", "spearmanr")),
        GlueTask("mnli", "MNLI", ("premise", "hypothesis"), ("sentence1", "sentence2"), "gold_label",
                 ("entailment", "neutral", "contradiction"), ("entailment", "neutral", "contradiction"),
                 ("accuracy",),
                 eval_files={"validation_matched": "dev_matched.tsv", "validation_mismatched": "dev_mismatched.tsv"}),
        GlueTask("qnli", "QNLI", ("question", "sentence"), ("question", "sentence"), "label", _NLI2, _NLI2,
                 ("accuracy",)),
        GlueTask("rte", "RTE", ("sentence1", "sentence2"), ("sentence1", "sentence2"), "label", _NLI2, _NLI2,
                 ("accuracy",)),
        # WNLI's file writes 1 for entailment; the Hub dataset's class 1 is "entailment" too.
        GlueTask("wnli", "WNLI", ("sentence1", "sentence2"), ("sentence1", "sentence2"), "label",
                 ("not_entailment", "entailment"), _BINARY, ("accuracy",)),
    )
}
TASK_NAMES: tuple[str, ...] = tuple(GLUE_TASKS)


def get_task(name: str) -> GlueTask:
    """The :class:`GlueTask` called ``name``; case, ``-`` and ``_`` are ignored (``"SST-2"`` is ``sst2``).

    Raises ``ValueError`` naming the unknown task and the allowed names.
    """
    key = str(name).lower().replace("-", "").replace("_", "")
    if key not in GLUE_TASKS:
        raise ValueError(f"Unknown GLUE task {name!r}: choose one of {', '.join(TASK_NAMES)}.")
    return GLUE_TASKS[key]


# --------------------------------------------------------------------------------------------------------------
# tsv loading
# --------------------------------------------------------------------------------------------------------------
def task_file(task: GlueTask | str, glue_dir: str | Path, split: str) -> Path:
    """Path of ``split``'s tsv file in the official layout, e.g. ``<glue_dir>/SST-2/dev.tsv``."""
    task = get_task(task) if isinstance(task, str) else task
    files = task.split_files()
    if split not in files:
        raise ValueError(f"GLUE task {task.name!r} has no labelled split {split!r}; its splits are {list(files)}.")
    return Path(glue_dir) / task.folder / files[split]


def available_splits(task: GlueTask | str, glue_dir: str | Path) -> list[str]:
    """The labelled splits of ``task`` whose file exists under ``glue_dir`` (e.g. only ``validation`` for a QNLI
    folder that lacks ``train.tsv``)."""
    task = get_task(task) if isinstance(task, str) else task
    return [split for split in task.split_files() if task_file(task, glue_dir, split).is_file()]


def _parse_label(task: GlueTask, raw: str) -> float | int | None:
    """The label id (classification) or score (regression) of a raw tsv field; ``None`` when it is not valid."""
    raw = raw.strip()
    if task.is_regression:
        try:
            value = float(raw)
        except ValueError:
            return None
        return value if math.isfinite(value) else None
    try:
        return task.file_labels.index(raw)
    except ValueError:
        return None


def read_glue_tsv(task: GlueTask | str, path: str | Path) -> dict[str, list]:
    """Read one labelled GLUE tsv file into columns: the task's ``text_columns``, ``label`` and ``idx``.

    Raises ``FileNotFoundError`` naming ``path`` when it does not exist, and ``ValueError`` when the header does not
    hold the task's columns (or, for CoLA, when rows do not have its four fields), or when more than
    ``MAX_BAD_ROW_FRACTION`` of the rows are malformed. A few malformed rows are skipped with a warning.
    """
    task = get_task(task) if isinstance(task, str) else task
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"GLUE {task.name} file not found: {path} (expected the official GLUE layout, "
                                f"<glue_dir>/{task.folder}/{{{', '.join(task.split_files().values())}}}).")
    # utf-8-sig drops MRPC's byte-order mark; split on "\n" only, as fields are never quoted in GLUE files.
    lines = [line.rstrip("\r") for line in path.read_text(encoding="utf-8-sig").split("\n")]
    lines = [line for line in lines if line.strip()]
    if not lines:
        raise ValueError(f"GLUE {task.name} file {path} is empty.")

    wanted = (*task.file_text_columns, task.file_label_column)
    if task.headerless_columns is not None:
        names, rows, first_line_no = task.headerless_columns, lines, 1
        first = lines[0].split("\t")
        if len(first) != len(names) or _parse_label(task, first[names.index(task.file_label_column)]) is None:
            raise ValueError(
                f"{path} does not look like a GLUE {task.name} file: its files have no header and "
                f"{len(names)} tab-separated fields ({', '.join(names)}), but line 1 is {lines[0][:120]!r}."
            )
    else:
        names = tuple(name.strip() for name in lines[0].split("\t"))
        rows, first_line_no = lines[1:], 2
        missing = [name for name in wanted if name not in names]
        if missing:
            raise ValueError(
                f"The header of {path} does not match GLUE task {task.name!r}: it needs the columns "
                f"{list(wanted)} but lacks {missing}; the header is {list(names)}."
            )
    positions = [names.index(name) for name in wanted]
    needed = max(positions) + 1

    columns: dict[str, list] = {name: [] for name in (*task.text_columns, "label", "idx")}
    bad_lines: list[int] = []
    for offset, line in enumerate(rows):
        fields = line.split("\t")
        label = _parse_label(task, fields[positions[-1]]) if len(fields) >= needed else None
        if label is None:
            bad_lines.append(first_line_no + offset)
            continue
        for column, position in zip(task.text_columns, positions[:-1]):
            columns[column].append(fields[position].strip())
        columns["label"].append(label)
        columns["idx"].append(len(columns["idx"]))
    if bad_lines:
        if len(bad_lines) > MAX_BAD_ROW_FRACTION * max(len(rows), 1):
            raise ValueError(
                f"{len(bad_lines)} of {len(rows)} rows of {path} are malformed for GLUE task {task.name!r} (too few "
                f"fields or a label not in {task.file_labels or 'float scores'}); first at line {bad_lines[0]}."
            )
        logger.warning("Skipped %d malformed row(s) of %s (first at line %d).", len(bad_lines), path, bad_lines[0])
    return columns


def glue_features(task: GlueTask | str):
    """The ``datasets.Features`` of a task, as on the Hub: string text columns, ``ClassLabel`` (or float32 for
    STS-B) ``label``, int32 ``idx``."""
    from datasets import ClassLabel, Features, Value

    task = get_task(task) if isinstance(task, str) else task
    label = Value("float32") if task.is_regression else ClassLabel(names=list(task.label_names))
    return Features({**{c: Value("string") for c in task.text_columns}, "label": label, "idx": Value("int32")})


def load_glue_local(task: GlueTask | str, glue_dir: str | Path, splits: Sequence[str] | None = None):
    """A ``datasets.DatasetDict`` of ``task`` read from the official tsv files under ``glue_dir``.

    ``splits`` defaults to every labelled split (``train`` and the evaluation splits); a split whose file is missing
    raises ``FileNotFoundError`` naming the path.
    """
    from datasets import Dataset, DatasetDict

    task = get_task(task) if isinstance(task, str) else task
    splits = list(splits) if splits is not None else list(task.split_files())
    features = glue_features(task)
    return DatasetDict({
        split: Dataset.from_dict(read_glue_tsv(task, task_file(task, glue_dir, split)), features=features)
        for split in splits
    })


# --------------------------------------------------------------------------------------------------------------
# metrics
# --------------------------------------------------------------------------------------------------------------
def glue_metrics(task: GlueTask | str, predictions: Sequence, references: Sequence) -> dict[str, float]:
    """The official GLUE metrics of ``task`` for class-id (or, for STS-B, score) ``predictions``.

    Keys follow ``evaluate``'s ``glue`` metric (``accuracy``, ``f1``, ``matthews_correlation``, ``pearson``,
    ``spearmanr``), plus ``combined_score`` (their mean) when there are several.
    """
    from scipy.stats import pearsonr, spearmanr
    from sklearn.metrics import f1_score, matthews_corrcoef

    task = get_task(task) if isinstance(task, str) else task
    predictions, references = np.asarray(predictions), np.asarray(references)
    if predictions.shape != references.shape or predictions.ndim != 1:
        raise ValueError(f"predictions and references must be 1-D of the same length, got shapes "
                         f"{predictions.shape} and {references.shape}.")
    result: dict[str, float] = {}
    for metric in task.metrics:
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
        else:  # a typo in the task table
            raise ValueError(f"Unknown GLUE metric {metric!r}.")
    if len(result) > 1:
        result["combined_score"] = float(np.mean(list(result.values())))
    return result


def make_compute_metrics(task: GlueTask | str) -> Callable:
    """A ``compute_metrics`` for ``Trainer``: argmax of the logits (squeeze for regression), then
    :func:`glue_metrics`."""
    task = get_task(task) if isinstance(task, str) else task

    def compute_metrics(eval_prediction) -> dict[str, float]:
        logits = eval_prediction.predictions
        logits = logits[0] if isinstance(logits, tuple) else logits
        predictions = np.squeeze(logits, axis=-1) if task.is_regression else np.argmax(logits, axis=-1)
        return glue_metrics(task, predictions, eval_prediction.label_ids)

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
