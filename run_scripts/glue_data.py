"""The GLUE task table, loading of the official GLUE tsv files, and the official GLUE metrics (offline).

Everything task-specific lives here, once: ``finetune_glue.py`` and ``run_glue_suite.py`` import it, and the tests
check it. The metrics follow the definitions of the official GLUE metric (``evaluate``'s ``glue`` module, which
needs the Hub at run time) with scikit-learn and scipy: accuracy; accuracy and binary F1 for MRPC and QQP;
Matthews correlation for CoLA; Pearson and Spearman correlation for STS-B; plus ``combined_score``, their mean,
where a task has several (as HF's ``run_glue.py`` does). Data given as csv/json files without a GLUE task is scored
as ``run_glue.py`` scores it: accuracy, or the mean squared error for a float label.

Test splits (``--do_predict``) are read from the same layout (``CoLA/test.tsv``, ``MNLI/test_matched.tsv``, the
MNLI-trained diagnostic ``diagnostic/diagnostic.tsv``) and predictions are written in the GLUE submission format:
one ``<TASK>.tsv`` per test set (``CoLA.tsv``, ``SST-2.tsv``, ``MNLI-m.tsv``, ``AX.tsv``, ...) with an
``index<TAB>prediction`` header and the benchmark's own label strings (``0``/``1``, ``entailment``, ...) or, for
STS-B, a float.

Local data uses the folder layout written by the official ``download_glue_data.py`` (``CoLA/train.tsv``,
``SST-2/dev.tsv``, ``MNLI/dev_matched.tsv``, ...). Quirks handled here: CoLA has no header line, MRPC starts with a
UTF-8 BOM, and fields are tab-separated with no quoting (quotes are part of the text).
"""

from __future__ import annotations

import logging
import math
import difflib
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

logger = logging.getLogger(__name__)

# Malformed rows (too few fields, an unknown label) are skipped with a warning up to this fraction of a file;
# beyond it the file is taken to be the wrong file and loading fails.
MAX_BAD_ROW_FRACTION = 0.01
# The GLUE diagnostic set (AX) is predicted with the MNLI model; its file lies outside MNLI's folder.
AX_SPLIT = "test_ax"
AX_FILE = ("diagnostic", "diagnostic.tsv")


class UsageError(ValueError):
    """A bad flag, file or folder found before training starts: the scripts print it as one ``error:`` line and exit
    with status 2."""


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


# --------------------------------------------------------------------------------------------------------------
# tsv loading
# --------------------------------------------------------------------------------------------------------------
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


# --------------------------------------------------------------------------------------------------------------
# csv / json data files (run_glue.py's --train_file / --validation_file / --test_file)
# --------------------------------------------------------------------------------------------------------------
DATA_FILE_FLAGS = {"train": "--train_file", "validation": "--validation_file", "test": "--test_file"}
DATA_FILE_FORMATS = {".csv": "csv", ".json": "json", ".jsonl": "json"}
_STRING_DTYPES = ("string", "large_string")
_INDEX_COLUMNS = ("idx", "index")


@dataclass
class FileData:
    """Splits read from csv/json files, each with the same text columns, a ``label`` column (train and validation:
    ``ClassLabel`` ids, or float32 scores when ``label_names`` is ``None``) and ``idx``; ``sources`` maps each split
    to its file and ``file_columns`` names the file columns that became ``text_columns``."""

    datasets: object  # a datasets.DatasetDict
    text_columns: tuple[str, ...]
    label_names: tuple[str, ...] | None
    sources: dict[str, Path]
    file_columns: tuple[str, ...]


def data_file_format(path: str | Path, flag: str) -> str:
    """``"csv"`` or ``"json"`` from the file's extension (``.csv``, ``.json``, ``.jsonl``); raises
    :class:`UsageError` naming the flag otherwise."""
    suffix = Path(path).suffix.lower()
    if suffix not in DATA_FILE_FORMATS:
        found = repr(suffix) if suffix else "a file without extension"
        raise UsageError(f"{flag} {path}: a csv or json file is needed (.csv, .json or .jsonl), not {found}.")
    return DATA_FILE_FORMATS[suffix]


def read_data_file(path: str | Path, flag: str, cache_dir: str | None = None):
    """One csv/json file as a ``datasets.Dataset`` (read by ``datasets``' csv/json builders, which infer the column
    types as ``run_glue.py`` gets them). A missing, empty or unreadable file raises :class:`UsageError` naming the
    flag and the file."""
    from datasets import load_dataset

    path = Path(path)
    kind = data_file_format(path, flag)
    if not path.is_file():
        raise UsageError(f"{flag} {path}: no such file.")
    with path.open("rb") as handle:
        head = handle.read(1 << 16)
    if not head.strip() and path.stat().st_size <= len(head):
        raise UsageError(f"{flag} {path} is empty.")
    import datasets

    bars = datasets.is_progress_bar_enabled()
    datasets.disable_progress_bars()  # a file of a few rows needs none, and an error stays one line
    try:
        dataset = load_dataset(kind, data_files={"data": str(path)}, cache_dir=cache_dir)["data"]
    except ValueError as error:
        if "corresponds to no data" in str(error):  # a csv header without rows, a json file holding []
            raise UsageError(f"{flag} {path} has no data rows.") from None
        raise UsageError(f"{flag} {path} could not be read as {kind}: {first_line(error)}") from None
    except Exception as error:  # datasets wraps the parser's error (DatasetGenerationError)
        cause = error.__cause__ or error.__context__ or error
        raise UsageError(f"{flag} {path} could not be read as {kind}: {first_line(cause)}") from None
    finally:
        if bars:
            datasets.enable_progress_bars()
    if len(dataset) == 0:
        raise UsageError(f"{flag} {path} has no data rows.")
    return dataset


def first_line(error: BaseException) -> str:
    """The first line of an exception's message (its type name when the message is empty)."""
    text = str(error).strip() or type(error).__name__
    return text.splitlines()[0]


def _is_text(dataset, column: str) -> bool:
    return getattr(dataset.features[column], "dtype", None) in _STRING_DTYPES


def pick_text_columns(dataset, path: str | Path, flag: str, task: GlueTask | None = None) -> tuple[str, ...]:
    """The text columns of a data file, by ``run_glue.py``'s rules: ``sentence1`` and ``sentence2`` when both are
    there, else the first two non-``label`` columns (or the only one). Columns that do not hold text (an integer
    ``id``, say) are passed over. With a GLUE ``task`` its own column names (``premise``/``hypothesis``, ...) win when
    present, and it takes as many columns as the task has texts. Raises :class:`UsageError` naming the file and its
    columns when there are too few text columns."""
    columns = dataset.column_names
    wanted = len(task.text_columns) if task is not None else 2
    if task is not None:
        for names in (task.text_columns, task.file_text_columns):
            if all(name in columns and _is_text(dataset, name) for name in names):
                return tuple(names)
    text = [name for name in columns if name != "label" and _is_text(dataset, name)]
    skipped = [name for name in columns if name != "label" and name not in text]
    if skipped:
        logger.info("%s: columns %s hold no text and are not model inputs.", path, skipped)
    if "sentence1" in text and "sentence2" in text and wanted == 2:
        return ("sentence1", "sentence2")
    not_text = f", of which {skipped} hold no text" if skipped else ""
    if task is not None and len(text) < wanted:
        raise UsageError(f"{flag} {path} has {len(text)} text column(s) but GLUE task {task.name!r} needs {wanted} "
                         f"(e.g. {' and '.join(task.text_columns)}); its columns are {columns}{not_text}.")
    if not text:
        raise UsageError(f"{flag} {path} has no text column (string values) besides 'label'; its columns are "
                         f"{columns}{not_text}.")
    return tuple(text[:wanted])


def _label_ids(values: list, path: Path, flag: str, label_names: Sequence[str] | None,
               aliases: Sequence[str] | None = None) -> list:
    """Map a file's ``label`` values to class ids in ``label_names``' order or, for ``label_names=None``, to float
    scores. With ``aliases`` (a GLUE task: the tsv spellings of the same classes) class ids ``0..k-1`` are accepted
    too. Raises :class:`UsageError` naming the file, the column and the first value that fits neither."""
    names, spellings = [str(name) for name in label_names or ()], [str(a) for a in aliases or ()]
    out: list = []
    for row, value in enumerate(values, start=1):
        if label_names is None:
            if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
                out.append(float(value))
                continue
            raise UsageError(f"{flag} {path}: column 'label' of data row {row} is {value!r}; a regression label "
                             "must be a number.")
        if isinstance(value, bool) or (isinstance(value, float) and value.is_integer()):
            value = int(value)
        key = str(value)
        if key in names:
            out.append(names.index(key))
        elif key in spellings:
            out.append(spellings.index(key))
        elif aliases is not None and key.isdigit() and int(key) < len(names):  # a class id
            out.append(int(key))
        else:
            allowed = names + [a for a in spellings if a not in names]
            raise UsageError(f"{flag} {path}: column 'label' of data row {row} is {value!r}, not one of the labels "
                             f"{allowed}.")
    return out


def load_data_files(files: dict[str, str | Path], task: GlueTask | str | None = None, cache_dir: str | None = None,
                    label_names: Sequence[str] | None = None, regression: bool | None = None) -> FileData:
    """Read ``{"train": path, "validation": path, "test": path}`` (any subset) with ``run_glue.py``'s rules.

    - Text columns: :func:`pick_text_columns` on the first file (train, else validation, else test); every other
      file must have them. With a GLUE ``task`` they are renamed to the task's names (so files and the GLUE folder
      can be mixed).
    - Labels: a ``label`` column, needed in train and validation (optional in test, where it is dropped). A GLUE task
      fixes the classes (a file may write class ids, the Hub's class names or the GLUE tsv labels). Otherwise a
      float label column means regression, and the classes are the sorted distinct training labels (validation's
      when there is no training file) unless ``label_names`` (a finetuned checkpoint's) already hold them all; with
      neither file, ``label_names`` / ``regression`` decide.
    - ``idx``: an integer ``idx`` or ``index`` column when there is one, else the row number.

    Raises :class:`UsageError` naming the flag, the file and the column for a missing, empty or unreadable file, a
    missing column or a label value that does not fit.
    """
    from datasets import ClassLabel, Dataset, DatasetDict, Features, Value

    task = get_task(task) if isinstance(task, str) else task
    unknown = [split for split in files if split not in DATA_FILE_FLAGS]
    if unknown or not files:
        raise ValueError(f"files must map some of {list(DATA_FILE_FLAGS)} to paths, got {list(files)}.")
    order = [split for split in DATA_FILE_FLAGS if split in files]
    raw = {split: read_data_file(files[split], DATA_FILE_FLAGS[split], cache_dir) for split in order}
    sources = {split: Path(files[split]) for split in order}
    first = order[0]
    file_columns = pick_text_columns(raw[first], sources[first], DATA_FILE_FLAGS[first], task)
    text_columns = task.text_columns if task is not None else file_columns

    for split in order:
        flag, path, dataset = DATA_FILE_FLAGS[split], sources[split], raw[split]
        for column in file_columns:
            if column not in dataset.column_names:
                raise UsageError(f"{flag} {path} lacks the text column {column!r} (taken from "
                                 f"{DATA_FILE_FLAGS[first]} {sources[first]}); its columns are {dataset.column_names}.")
            if not _is_text(dataset, column):
                raise UsageError(f"{flag} {path}: column {column!r} does not hold text "
                                 f"({dataset.features[column]}).")
            missing = next((row for row, value in enumerate(dataset[column], 1) if value is None), None)
            if missing is not None:
                raise UsageError(f"{flag} {path}: column {column!r} is empty in data row {missing}.")
        if split != "test" and "label" not in dataset.column_names:
            raise UsageError(f"{flag} {path} lacks the column 'label'; its columns are {dataset.column_names}.")

    labelled = [split for split in order if split != "test"]
    aliases = None
    if task is not None:
        names = task.label_names
        aliases = task.file_labels
    elif labelled:
        reference = raw["train"] if "train" in raw else raw[labelled[0]]
        dtype = getattr(reference.features["label"], "dtype", None)
        if dtype in ("float32", "float64", "float16"):
            names = None
        else:
            values = sorted(set(reference["label"]), key=lambda v: (str(type(v)), v))
            if any(v is None for v in values):
                raise UsageError(f"{DATA_FILE_FLAGS[labelled[0]]} {sources[labelled[0]]}: column 'label' has "
                                 "empty values.")
            found = [str(v) for v in values]
            names = tuple(label_names) if label_names and set(found) <= set(label_names) else tuple(found)
            if len(names) < 2:
                raise UsageError(f"{DATA_FILE_FLAGS[labelled[0]]} {sources[labelled[0]]}: column 'label' has a "
                                 f"single class {found}; classification needs at least two (float labels mean "
                                 "regression).")
    elif regression:
        names = None
    elif label_names:
        names = tuple(label_names)
    else:
        raise UsageError("--test_file alone does not say what the labels are: give --task_name, a --train_file or "
                         "--validation_file, or a --model_name_or_path finetuned with labels.")

    label_feature = Value("float32") if names is None else ClassLabel(names=list(names))
    result = {}
    for split in order:
        flag, path, dataset = DATA_FILE_FLAGS[split], sources[split], raw[split]
        columns = {target: list(dataset[source]) for target, source in zip(text_columns, file_columns)}
        features = {target: Value("string") for target in text_columns}
        if split != "test":
            columns["label"] = _label_ids(list(dataset["label"]), path, flag, names, aliases)
            features["label"] = label_feature
        index = next((c for c in _INDEX_COLUMNS if c in dataset.column_names
                      and str(getattr(dataset.features[c], "dtype", "")).startswith(("int", "uint"))), None)
        columns["idx"] = list(dataset[index]) if index is not None else list(range(len(dataset)))
        features["idx"] = Value("int64")
        result[split] = Dataset.from_dict(columns, features=Features(features))
    return FileData(DatasetDict(result), tuple(text_columns), None if names is None else tuple(names), sources,
                    tuple(file_columns))


# --------------------------------------------------------------------------------------------------------------
# model, config and tokenizer folders
# --------------------------------------------------------------------------------------------------------------
def _looks_local(value: str) -> bool:
    """Whether ``value`` can only be a local path (a Hub id is ``name`` or ``org/name``)."""
    if value.startswith(("/", ".", "~")) or value.endswith(("/", ".json")) or value.count("/") > 1:
        return True
    if os.sep != "/" and os.sep in value:
        return True
    return "/" in value and Path(value).expanduser().parent.is_dir()  # "outputs/mlmm" where outputs/ exists


def _closest(path: Path) -> str:
    """`` (did you mean 'outputs/mlm'?)`` for the closest existing name beside the nearest existing folder."""
    parent = path.parent
    while not parent.is_dir() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir():
        return ""
    try:
        names = sorted(entry.name for entry in parent.iterdir() if entry.is_dir())
    except OSError:
        return ""
    part = path.relative_to(parent).parts[0] if path.is_relative_to(parent) and path != parent else path.name
    match = difflib.get_close_matches(part, names, n=1)
    return f" (did you mean {str(parent / match[0])!r}?)" if match else ""


def _hub_lookup_error(value: str) -> str | None:
    """``None`` when ``value`` can be loaded as a Hub model id (it exists there, or is in the local Hub cache, or the
    Hub is switched off with ``HF_HUB_OFFLINE`` and transformers will look in the cache itself); else why not. One
    metadata request, which fails at once without the network (file downloads retry for about 45 s first)."""
    from huggingface_hub import constants, model_info, try_to_load_from_cache
    from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError

    if constants.HF_HUB_OFFLINE:
        return None
    try:
        model_info(value, timeout=10)
    except GatedRepoError:
        return None
    except RepositoryNotFoundError:
        return "nor a model on the Hub (a private one needs `hf auth login`)"
    except Exception as error:  # no network: connection errors, timeouts
        try:
            if isinstance(try_to_load_from_cache(value, "config.json"), str):
                return None
        except Exception:  # an id the cache cannot even parse
            pass
        return f"and the Hub cannot be reached to look it up as a model id ({first_line(error)})"
    return None


def check_local_source(value: str | None, flag: str, needs: Sequence[str] = ("config.json",),
                       allow_file: bool = False, hub: bool = True) -> None:
    """Refuse, before anything is loaded, a ``--model_name_or_path`` / ``--config_name`` / ``--tokenizer_name`` that
    names a local folder which does not exist (or lacks all of ``needs``): transformers would take it for a Hub id
    and fail on the network after a long wait. Raises :class:`UsageError` naming the flag and the folder (and the
    closest existing name). A value that can be a Hub id (``name``, ``org/name``) and is no local path is looked up
    on the Hub when ``hub`` is true: refused when it is not there or the Hub is unreachable and it is not cached."""
    if value is None:
        return
    path = Path(value).expanduser()
    if path.is_dir():
        if needs and not any((path / name).is_file() for name in needs):
            raise UsageError(f"{flag} {value!r} is a folder without {' or '.join(needs)}.")
        return
    if path.exists():
        if allow_file:
            return
        raise UsageError(f"{flag} {value!r} is a file; a folder (or a Hub id) is needed.")
    if _looks_local(value):
        raise UsageError(f"{flag} {value!r}: no such local folder{_closest(path)}.")
    problem = _hub_lookup_error(value) if hub else None
    if problem is not None:
        raise UsageError(f"{flag} {value!r} is not a local folder{_closest(path)}, {problem}.")


# --------------------------------------------------------------------------------------------------------------
# metrics
# --------------------------------------------------------------------------------------------------------------
# Metrics of data files given without a GLUE task, as run_glue.py scores them.
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
