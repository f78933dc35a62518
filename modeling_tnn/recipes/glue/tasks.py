"""The GLUE tasks: names, label sets, text columns, metrics, the official tsv layout (train/dev/test files, the
diagnostic set) and the submission format of test-set predictions."""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ..common.run_files import BenchmarkRecord, BenchmarkScore

logger = logging.getLogger(__name__)
# Malformed rows (too few fields, an unknown label) are skipped with a warning up to this fraction of a file;
# beyond it the file is taken to be the wrong file and loading fails.
MAX_BAD_ROW_FRACTION = 0.01
# The GLUE diagnostic set (AX) is predicted with the MNLI model; its file lies outside MNLI's folder.
AX_SPLIT = "test_ax"
AX_FILE = ("diagnostic", "diagnostic.tsv")
# The suffix of an evaluation split's result keys: run_glue.py's naming for MNLI-mm (``eval_accuracy_mm``).
RESULT_SUFFIXES = {"validation_mismatched": "_mm"}
GLUE_HUB_ID = "nyu-mll/glue"


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
    test_files: dict[str, str] = field(default_factory=lambda: {"test": "test.tsv"})

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

    @property
    def test_splits(self) -> tuple[str, ...]:
        """Names of the unlabelled test splits (``test``; MNLI: matched, mismatched and the diagnostic ``test_ax``)."""
        return tuple(self.test_files)

    def split_files(self) -> dict[str, str]:
        """File name of every split with labels: ``{"train": "train.tsv", "validation": "dev.tsv", ...}``."""
        return {"train": "train.tsv", **self.eval_files}

    def submission_file(self, split: str) -> str:
        """The file name the GLUE submission expects for the predictions of test split ``split``: ``CoLA.tsv``,
        ``SST-2.tsv``, ``STS-B.tsv``, ..., ``MNLI-m.tsv`` / ``MNLI-mm.tsv`` and ``AX.tsv`` (the diagnostic set)."""
        names = {"test_matched": "MNLI-m.tsv", "test_mismatched": "MNLI-mm.tsv", AX_SPLIT: "AX.tsv"}
        if split not in self.test_files:
            raise ValueError(f"GLUE task {self.name!r} has no test split {split!r}; its test splits are "
                             f"{list(self.test_files)}.")
        return names.get(split, f"{self.folder}.tsv")

    def benchmark_record(self) -> BenchmarkRecord:
        """What the model card of a run finetuned on this task reports: the Hub dataset ``nyu-mll/glue`` and this
        task's config, and the task's metrics on each evaluation split (plus ``combined_score`` when there are
        several, as :func:`.metrics.glue_metrics` computes it)."""
        metrics = [*self.metrics, "combined_score"] if len(self.metrics) > 1 else list(self.metrics)
        scores = tuple(BenchmarkScore(key=f"eval_{metric}{RESULT_SUFFIXES.get(split, '')}", metric=metric, split=split)
                       for split in self.eval_splits for metric in metrics)
        return BenchmarkRecord(dataset=GLUE_HUB_ID, config=self.name, name=f"GLUE {self.folder}", scores=scores,
                               text_pair=len(self.text_columns) == 2)

    def submission_label(self, label_id: int) -> str:
        """How the GLUE submission writes class ``label_id``: the benchmark's own label strings (``0``/``1`` for
        CoLA, SST-2, MRPC, QQP and WNLI; ``entailment``/``not_entailment``; MNLI's three classes)."""
        if self.file_labels is None:
            raise ValueError(f"GLUE task {self.name!r} is a regression task: its predictions are scores.")
        return self.file_labels[int(label_id)]


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
                 eval_files={"validation_matched": "dev_matched.tsv", "validation_mismatched": "dev_mismatched.tsv"},
                 test_files={"test_matched": "test_matched.tsv", "test_mismatched": "test_mismatched.tsv",
                             AX_SPLIT: "/".join(AX_FILE)}),
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


def task_file(task: GlueTask | str, glue_dir: str | Path, split: str) -> Path:
    """Path of ``split``'s tsv file in the official layout, e.g. ``<glue_dir>/SST-2/dev.tsv``,
    ``<glue_dir>/CoLA/test.tsv``, or ``<glue_dir>/diagnostic/diagnostic.tsv`` for MNLI's ``test_ax``."""
    task = get_task(task) if isinstance(task, str) else task
    files = {**task.split_files(), **task.test_files}
    if split not in files:
        raise ValueError(f"GLUE task {task.name!r} has no split {split!r}; its splits are {list(files)}.")
    if split == AX_SPLIT:
        return Path(glue_dir).joinpath(*AX_FILE)
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


def read_glue_test_tsv(task: GlueTask | str, path: str | Path) -> dict[str, list]:
    """Read one unlabelled GLUE test file into columns: the task's ``text_columns`` and ``idx``.

    Test files have a header in every task (CoLA's too) naming the text columns as the labelled files do, and an
    index column (``index``; QQP's is ``id``) whose values become ``idx`` (the submission's ``index``; row numbers
    when there is none). No row may be skipped, since the submission needs one prediction per row: a row with too
    few fields raises ``ValueError`` naming its line, as does a header without the task's columns. A missing file
    raises ``FileNotFoundError`` naming it.
    """
    task = get_task(task) if isinstance(task, str) else task
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"GLUE {task.name} test file not found: {path}.")
    lines = [line.rstrip("\r") for line in path.read_text(encoding="utf-8-sig").split("\n")]
    lines = [line for line in lines if line.strip()]
    if not lines:
        raise ValueError(f"GLUE {task.name} test file {path} is empty.")
    names = [name.strip() for name in lines[0].split("\t")]
    missing = [name for name in task.file_text_columns if name not in names]
    if missing:
        raise ValueError(f"The header of {path} does not match GLUE task {task.name!r}: a test file needs the columns "
                         f"{list(task.file_text_columns)} but lacks {missing}; the header is {names}.")
    index_column = next((name for name in ("index", "id") if name in names), None)
    positions = [names.index(name) for name in task.file_text_columns]
    index_position = None if index_column is None else names.index(index_column)
    needed = max([*positions, index_position or 0]) + 1
    columns: dict[str, list] = {name: [] for name in (*task.text_columns, "idx")}
    for line_no, line in enumerate(lines[1:], start=2):
        fields = line.split("\t")
        if len(fields) < needed:
            raise ValueError(f"{path} line {line_no} has {len(fields)} tab-separated fields where {needed} are "
                             "needed (no test row is skipped: the submission needs a prediction for each).")
        for column, position in zip(task.text_columns, positions):
            columns[column].append(fields[position].strip())
        if index_position is None:
            columns["idx"].append(line_no - 2)
            continue
        try:
            columns["idx"].append(int(fields[index_position]))
        except ValueError:
            raise ValueError(f"{path} line {line_no}: its {index_column!r} field is {fields[index_position]!r}, "
                             "not an integer.") from None
    return columns


def glue_features(task: GlueTask | str, labelled: bool = True):
    """The ``datasets.Features`` of a task, as on the Hub: string text columns, ``ClassLabel`` (or float32 for
    STS-B) ``label``, int32 ``idx``. ``labelled=False`` (test splits) leaves ``label`` out."""
    from datasets import ClassLabel, Features, Value

    task = get_task(task) if isinstance(task, str) else task
    label = Value("float32") if task.is_regression else ClassLabel(names=list(task.label_names))
    columns = {**{c: Value("string") for c in task.text_columns}, **({"label": label} if labelled else {})}
    return Features({**columns, "idx": Value("int32")})


def load_glue_local(task: GlueTask | str, glue_dir: str | Path, splits: Sequence[str] | None = None):
    """A ``datasets.DatasetDict`` of ``task`` read from the official tsv files under ``glue_dir``.

    ``splits`` defaults to every labelled split (``train`` and the evaluation splits); test splits
    (``task.test_splits``) may be asked for too, and have no ``label`` column. A split whose file is missing raises
    ``FileNotFoundError`` naming the path.
    """
    from datasets import Dataset, DatasetDict

    task = get_task(task) if isinstance(task, str) else task
    splits = list(splits) if splits is not None else list(task.split_files())
    result = {}
    for split in splits:
        path = task_file(task, glue_dir, split)
        if split in task.test_files:
            result[split] = Dataset.from_dict(read_glue_test_tsv(task, path), features=glue_features(task, False))
        else:
            result[split] = Dataset.from_dict(read_glue_tsv(task, path), features=glue_features(task))
    return DatasetDict(result)


def write_predictions(path: str | Path, indices: Sequence[int], predictions: Sequence,
                      label_names: Sequence[str] | None) -> Path:
    """Write ``predictions`` in the GLUE submission format and return the path: an ``index<TAB>prediction`` header,
    then one row per example. A class id is written as ``label_names[id]``; with ``label_names=None`` (regression)
    a score is written with three decimals."""
    path = Path(path)
    if len(indices) != len(predictions):
        raise ValueError(f"{len(indices)} indices but {len(predictions)} predictions.")
    rows = ["index\tprediction"]
    for index, prediction in zip(indices, predictions):
        value = f"{float(prediction):.3f}" if label_names is None else label_names[int(prediction)]
        rows.append(f"{int(index)}\t{value}")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(rows) + "\n", encoding="utf-8")
    return path
