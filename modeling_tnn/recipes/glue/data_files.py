"""Finetuning on your own csv/json files with ``--train_file`` / ``--validation_file`` / ``--test_file``, with the
rules of transformers' ``run_glue.py`` (text columns, label column, label ids)."""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ..common.flag_checks import UsageError, first_line
from .tasks import GlueTask, get_task

logger = logging.getLogger(__name__)


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
