"""The data of a finetuning run: GLUE splits (local tsv files or the Hub) or data files, their label sets, and what
each test split's predictions are written to."""

from __future__ import annotations

import json
import logging
import re
from dataclasses import dataclass
from pathlib import Path

import datasets
from transformers import (
    TrainingArguments,
)

from ..common.flag_checks import UsageError, first_line
from ..common.run_files import PREDICTIONS_FILE
from .arguments import DataTrainingArguments, ModelArguments
from .data_files import load_data_files
from .tasks import AX_SPLIT, GlueTask, get_task, load_glue_local, task_file

logger = logging.getLogger(__name__)


@dataclass
class Inputs:
    """The data of a run: ``raw`` holds every split it needs (text columns, ``label`` for labelled splits,
    ``idx``); ``label_names`` is ``None`` for regression; ``prediction_files`` names the output file of each test
    split and ``prediction_labels`` how a class is written there; ``description`` and ``eval_description`` name the
    data and the evaluation data for the card."""

    raw: datasets.DatasetDict
    task: GlueTask | None
    text_columns: tuple[str, ...]
    label_names: tuple[str, ...] | None
    eval_splits: list[str]
    predict_splits: list[str]
    prediction_files: dict[str, str]
    prediction_labels: tuple[str, ...] | None
    description: str
    eval_description: str

    @property
    def is_regression(self) -> bool:
        return self.label_names is None


def checkpoint_labels(model_args: ModelArguments) -> tuple[tuple[str, ...] | None, bool | None]:
    """The class names (or regression) a local finetuned checkpoint was saved with; ``(None, None)`` when it has
    none (a pretrained LM, or ``LABEL_0``-style defaults)."""
    if not model_args.model_name_or_path:
        return None, None
    config_file = Path(model_args.model_name_or_path).expanduser() / "config.json"
    if not config_file.is_file():
        return None, None
    config = json.loads(config_file.read_text())
    if config.get("problem_type") == "regression":
        return None, True
    id2label = config.get("id2label") or {}
    names = tuple(str(id2label[key]) for key in sorted(id2label, key=int))
    if names and not all(re.fullmatch(r"LABEL_\d+", name) for name in names):
        return names, False
    return None, None


def _glue_splits(task: GlueTask, data_args: DataTrainingArguments, splits: list[str],
                 cache_dir: str | None) -> datasets.DatasetDict:
    """GLUE splits from the local tsv files (``--glue_dir``) or the Hub; test splits come without ``label``. The
    diagnostic set (``test_ax``) is left out with a warning when its file is not there."""
    if data_args.glue_dir is not None:
        if not Path(data_args.glue_dir).is_dir():
            raise UsageError(f"--glue_dir {data_args.glue_dir!r}: no such folder.")
        if AX_SPLIT in splits and not task_file(task, data_args.glue_dir, AX_SPLIT).is_file():
            logger.warning("No %s: the GLUE diagnostic set (AX.tsv) is not predicted.",
                           task_file(task, data_args.glue_dir, AX_SPLIT))
            splits = [split for split in splits if split != AX_SPLIT]
        try:
            return load_glue_local(task, data_args.glue_dir, splits)
        except (ValueError, FileNotFoundError) as error:
            raise UsageError(str(error)) from None
    from datasets import load_dataset

    def hub(config: str):
        try:
            return load_dataset(data_args.dataset_name, config, cache_dir=cache_dir)
        except (ConnectionError, OSError, ValueError) as error:  # offline, or no such dataset / config
            raise UsageError(f"--dataset_name {data_args.dataset_name!r} (config {config!r}) could not be loaded: "
                             f"{first_line(error)}; without the network, give --glue_dir (the official GLUE tsv "
                             "layout) or data files.") from None

    raw = hub(task.name)
    out = {}
    for split in splits:
        dataset = hub("ax")["test"] if split == AX_SPLIT else raw[split]
        if split in task.test_files and "label" in dataset.column_names:
            dataset = dataset.remove_columns("label")  # the Hub's test labels are -1
        out[split] = dataset
    return datasets.DatasetDict(out)


def load_inputs(data_args: DataTrainingArguments, training_args: TrainingArguments,
                model_args: ModelArguments) -> Inputs:
    """Every split the run needs, from the GLUE folder / the Hub and the data files (a file replaces the task's
    split: ``--validation_file`` its dev set(s), ``--test_file`` its test set(s)). Raises :class:`UsageError` for a
    split that has no source, and for a missing, empty or malformed file (naming it and the column)."""
    task = get_task(data_args.task_name) if data_args.task_name else None
    files = {"train": data_args.train_file, "validation": data_args.validation_file, "test": data_args.test_file}
    eval_splits = ["validation"] if files["validation"] else list(task.eval_splits) if task else []
    predict_splits = ["test"] if files["test"] else list(task.test_splits) if task else []
    if training_args.do_train and not (task or files["train"]):
        raise UsageError("--do_train needs --train_file (or --task_name for a GLUE task).")
    if training_args.do_eval and not eval_splits:
        raise UsageError("--do_eval needs --validation_file (or --task_name for a GLUE task).")
    if training_args.do_predict and not predict_splits:
        raise UsageError("--do_predict needs --test_file (or --task_name for a GLUE task).")
    wanted = ((["train"] if training_args.do_train else []) + (eval_splits if training_args.do_eval else [])
              + (predict_splits if training_args.do_predict else []))

    from_files = {split: files[split] for split in wanted if split in files and files[split]}
    from_glue = [split for split in wanted if split not in from_files]
    raw: dict = {}
    text_columns = task.text_columns if task else ()
    label_names = task.label_names if task else None
    if from_files:
        names, regression = checkpoint_labels(model_args)
        file_data = load_data_files(from_files, task, model_args.cache_dir, label_names=names, regression=regression)
        raw.update(file_data.datasets)
        text_columns, label_names = file_data.text_columns, file_data.label_names
        logger.info("Data files: text columns %s, %s", list(file_data.file_columns),
                    "regression" if label_names is None else f"labels {list(label_names)}")
    if from_glue:
        raw.update(_glue_splits(task, data_args, from_glue, model_args.cache_dir))
    predict_splits = [split for split in predict_splits if split in raw]  # AX may be absent locally
    prediction_files = {split: PREDICTIONS_FILE if split in from_files else task.submission_file(split)
                        for split in predict_splits}
    if task is not None:
        prediction_labels = task.file_labels  # the GLUE submission's own label strings
        description = f"GLUE {task.name.upper()}"
    else:
        prediction_labels = label_names
        description = ", ".join(Path(path).name for path in from_files.values())
    eval_description = Path(files["validation"]).name if files["validation"] else description
    return Inputs(datasets.DatasetDict(raw), task, tuple(text_columns), label_names, eval_splits, predict_splits,
                  prediction_files, prediction_labels, description, eval_description)
