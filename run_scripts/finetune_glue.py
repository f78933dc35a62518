#!/usr/bin/env python
"""Finetune a TNN (or any ``AutoModelForSequenceClassification`` model) on a GLUE task with ``Trainer``.

It follows the conventions of HF's ``run_glue.py``: ``HfArgumentParser`` over model, data and ``TrainingArguments``
(or one ``.json`` file holding them all), ``--task_name`` for the nine GLUE tasks or ``--train_file`` /
``--validation_file`` / ``--test_file`` (csv or json) for other data, dynamic padding with
``DataCollatorWithPadding``, ``eval_results.json`` with ``eval_`` prefixes, ``--do_predict``, and a model card in the
output folder. It works offline: data comes from ``--glue_dir`` (the official GLUE tsv layout; for this project
``$TNN_DATA_DIR/glue``) or the data files, and the metrics are computed with scikit-learn/scipy (``glue_data.py``),
never ``evaluate.load``. Without ``--glue_dir`` the Hub dataset ``--dataset_name`` (``nyu-mll/glue``) is loaded.

Examples::

    # from a pretrained (masked LM) checkpoint folder holding a tokenizer; also write the test-set predictions
    python run_scripts/finetune_glue.py --model_name_or_path outputs/mlm --task_name sst2 \\
        --glue_dir "$TNN_DATA_DIR/glue" --do_train --do_eval --do_predict --output_dir outputs/glue/sst2
    # from scratch: a preset (or config path) and a tokenizer folder
    python run_scripts/finetune_glue.py --config_name small --tokenizer_name outputs/mlm --task_name rte ...
    # your own data: csv or json with a `label` column
    python run_scripts/finetune_glue.py --model_name_or_path outputs/mlm --train_file train.csv \\
        --validation_file dev.csv --do_train --do_eval --output_dir outputs/mine

MNLI is evaluated on the matched and the mismatched dev sets (the latter's metrics get an ``_mm`` suffix).
``--do_predict`` writes one file per test set in the GLUE submission format (``SST-2.tsv``, ``MNLI-m.tsv``,
``MNLI-mm.tsv``, ``AX.tsv``, ...: ``index<TAB>prediction``), or ``predict_results.tsv`` for a ``--test_file``.
Input errors (a missing local folder or file, an empty file, a missing column) print one ``error:`` line and exit
with status 2 before anything is trained.
"""

from __future__ import annotations

import json
import logging
import os
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

import datasets
import numpy as np
import transformers
from transformers import (
    AutoConfig,
    AutoModelForSequenceClassification,
    AutoTokenizer,
    DataCollatorWithPadding,
    HfArgumentParser,
    PretrainedConfig,
    Trainer,
    TrainingArguments,
    default_data_collator,
    set_seed,
)

import modeling_tnn  # noqa: F401  (registers model_type "tnn" with the Auto classes)
from modeling_tnn import list_presets, load_preset

sys.path.insert(0, str(Path(__file__).resolve().parent))
from glue_data import (  # noqa: E402
    AX_SPLIT,
    GlueTask,
    UsageError,
    check_local_source,
    data_file_format,
    first_line,
    get_task,
    load_data_files,
    load_glue_local,
    make_compute_metrics,
    task_file,
    write_predictions,
)

logger = logging.getLogger(__name__)
TOKENIZER_FILES = ("tokenizer_config.json", "tokenizer.json", "vocab.json", "vocab.txt")
PREDICTIONS_FILE = "predict_results.tsv"  # the predictions of a --test_file (GLUE test sets use the GLUE names)


@dataclass
class ModelArguments:
    """Which model, config and tokenizer to finetune (a pretrained checkpoint, or a config for from-scratch runs)."""

    model_name_or_path: str | None = field(
        default=None,
        metadata={"help": "A checkpoint folder or Hub id loaded with AutoModelForSequenceClassification (e.g. the "
                          "output of train_mlm.py). Leave it out to train from scratch with --config_name."},
    )
    config_name: str | None = field(
        default=None,
        metadata={"help": "A TNN preset name (" + ", ".join(list_presets()) + "), a TNN JSON config, or any config "
                          "folder/file/Hub id. Required when training from scratch."},
    )
    tokenizer_name: str | None = field(
        default=None,
        metadata={"help": "Tokenizer folder or Hub id; defaults to --model_name_or_path. Required from scratch."},
    )
    config_overrides: str | None = field(
        default=None,
        metadata={"help": "From scratch only: comma-separated config overrides, e.g. 'hidden_size=64,dropout=0.0'."},
    )
    cache_dir: str | None = field(default=None, metadata={"help": "Where downloads from the Hub are cached."})
    trust_remote_code: bool = field(
        default=False,
        metadata={"help": "Allow the model code saved in the checkpoint folder (auto_map) to run; needed where "
                          "modeling_tnn is not installed."},
    )
    ignore_mismatched_sizes: bool = field(
        default=False, metadata={"help": "Reinitialise a classification head whose number of labels differs."}
    )


@dataclass
class DataTrainingArguments:
    """Which GLUE task or data files, where the data is, and how it is tokenised and subsampled."""

    task_name: str | None = field(
        default=None,
        metadata={"help": "One of cola, sst2, mrpc, qqp, stsb, mnli, qnli, rte, wnli. Leave it out to train on "
                          "--train_file / --validation_file / --test_file alone."},
    )
    glue_dir: str | None = field(
        default=None,
        metadata={"help": "Folder in the official GLUE layout (CoLA/train.tsv, SST-2/dev.tsv, SST-2/test.tsv, ...), "
                          "e.g. $TNN_DATA_DIR/glue. Without it the Hub dataset --dataset_name is used."},
    )
    dataset_name: str = field(default="nyu-mll/glue", metadata={"help": "Hub dataset used when --glue_dir is unset."})
    train_file: str | None = field(
        default=None,
        metadata={"help": "A csv or json file of training data: a 'label' column (float labels mean regression) and "
                          "the text in 'sentence1'/'sentence2', else the first one or two other text columns."},
    )
    validation_file: str | None = field(
        default=None, metadata={"help": "A csv or json file of evaluation data, with the training file's columns."}
    )
    test_file: str | None = field(
        default=None,
        metadata={"help": "A csv or json file to predict (--do_predict), with the training file's text columns; a "
                          f"'label' column is ignored. Predictions go to {PREDICTIONS_FILE}."},
    )
    max_seq_length: int = field(default=128, metadata={"help": "Longer inputs are truncated."})
    pad_to_max_length: bool = field(
        default=False,
        metadata={"help": "Pad every input to max_seq_length; the default pads each batch to its longest row, which "
                          "gives the same outputs for TNN (its padding masks are exact) and is faster."},
    )
    max_train_samples: int | None = field(default=None, metadata={"help": "Keep the first N training rows."})
    max_eval_samples: int | None = field(
        default=None, metadata={"help": "Keep the first N rows of each evaluation split."}
    )
    max_predict_samples: int | None = field(
        default=None, metadata={"help": "Predict only the first N rows of each test split."}
    )
    train_subsample_seed: int | None = field(
        default=None,
        metadata={"help": "Shuffle the training rows with this seed before --max_train_samples keeps the first N "
                          "(the default keeps the file's first N rows, as run_glue.py does)."},
    )
    preprocessing_num_workers: int | None = field(default=None, metadata={"help": "Processes for tokenisation."})

    def __post_init__(self) -> None:
        if self.task_name is not None:
            try:
                self.task_name = get_task(self.task_name).name
            except ValueError as error:
                raise UsageError(str(error)) from None
        elif not (self.train_file or self.validation_file or self.test_file):
            raise UsageError("Give --task_name (a GLUE task) or data files (--train_file, --validation_file, "
                             "--test_file; csv or json).")
        for flag, path in (("--train_file", self.train_file), ("--validation_file", self.validation_file),
                           ("--test_file", self.test_file)):
            if path is not None:
                data_file_format(path, flag)
        if self.max_seq_length < 1:
            raise UsageError(f"--max_seq_length must be positive, got {self.max_seq_length}.")
        for name in ("max_train_samples", "max_eval_samples", "max_predict_samples"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise UsageError(f"--{name} must be positive, got {value}.")


def parse_args(argv: list[str] | None = None) -> tuple[ModelArguments, DataTrainingArguments, TrainingArguments]:
    """Parse ``argv`` (default ``sys.argv[1:]``), or a single ``.json`` file holding all the arguments."""
    parser = HfArgumentParser((ModelArguments, DataTrainingArguments, TrainingArguments))
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) == 1 and argv[0].endswith(".json"):
        return parser.parse_json_file(json_file=os.path.abspath(argv[0]))
    return parser.parse_args_into_dataclasses(args=argv)


def check_model_sources(model_args: ModelArguments) -> None:
    """Refuse a local ``--model_name_or_path`` / ``--config_name`` / ``--tokenizer_name`` that does not exist before
    anything is loaded (transformers would take it for a Hub id and fail on the network): one
    :class:`UsageError` naming the flag and the folder."""
    check_local_source(model_args.model_name_or_path, "--model_name_or_path")
    if model_args.config_name is not None and model_args.config_name not in list_presets():
        check_local_source(model_args.config_name, "--config_name", allow_file=True)
    check_local_source(model_args.tokenizer_name, "--tokenizer_name", needs=TOKENIZER_FILES)


def _from_pretrained(loader, flag: str, value: str, *args, **kwargs):
    """``loader(value, ...)`` with a failure turned into one line naming the flag (and, when ``value`` is no local
    path, saying that the Hub was tried)."""
    try:
        return loader(value, *args, **kwargs)
    except OSError as error:
        local = Path(value).expanduser().exists()
        where = "" if local else " is not a local folder, and loading it from the Hub failed"
        raise UsageError(f"{flag} {value!r}{where}: {first_line(error)}") from None


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


def _is_tnn_json(path: Path) -> bool:
    # The project's presets carry no model_type; a saved TnnConfig says "tnn".
    return path.suffix == ".json" and path.is_file() and json.loads(path.read_text()).get("model_type", "tnn") == "tnn"


def scratch_config(model_args: ModelArguments, tokenizer, num_labels: int) -> PretrainedConfig:
    """The config of a from-scratch model: a TNN preset or JSON (``vocab_size`` and the special tokens follow the
    tokenizer), or any other config folder/file/Hub id (e.g. a BERT config for a baseline)."""
    name = model_args.config_name
    special = {"pad_token_id": tokenizer.pad_token_id, "bos_token_id": tokenizer.bos_token_id,
               "eos_token_id": tokenizer.eos_token_id}
    if name in list_presets() or _is_tnn_json(Path(name)):
        config = load_preset(name, vocab_size=len(tokenizer), num_labels=num_labels, **special)
    else:
        config = AutoConfig.from_pretrained(name, num_labels=num_labels, cache_dir=model_args.cache_dir,
                                            trust_remote_code=model_args.trust_remote_code)
        if getattr(config, "vocab_size", len(tokenizer)) < len(tokenizer):
            raise ValueError(f"Config {name!r} has vocab_size={config.vocab_size} but the tokenizer has "
                             f"{len(tokenizer)} tokens.")
        if getattr(config, "pad_token_id", None) is None:
            config.pad_token_id = tokenizer.pad_token_id
    if model_args.config_overrides:
        logger.info("Overriding config: %s", model_args.config_overrides)
        config.update_from_string(model_args.config_overrides)
        if hasattr(config, "validate_fields"):
            config.validate_fields()
    return config


def build_model_and_tokenizer(model_args: ModelArguments, task_name: str | None, label_names: tuple[str, ...] | None):
    """Tokenizer and sequence-classification model, from a checkpoint or from scratch, with the task's labels
    (``label_names=None``: one regression output). Loading failures raise one-line :class:`UsageError`."""
    num_labels = 1 if label_names is None else len(label_names)
    hub = {"cache_dir": model_args.cache_dir, "trust_remote_code": model_args.trust_remote_code}
    if model_args.model_name_or_path is None and (model_args.config_name is None or model_args.tokenizer_name is None):
        raise UsageError("Give --model_name_or_path, or --config_name and --tokenizer_name to train from scratch.")
    if model_args.model_name_or_path is not None and model_args.config_overrides:
        raise UsageError("--config_overrides only applies from scratch (without --model_name_or_path).")

    tokenizer_flag = "--tokenizer_name" if model_args.tokenizer_name else "--model_name_or_path"
    tokenizer_source = model_args.tokenizer_name or model_args.model_name_or_path
    tokenizer = _from_pretrained(AutoTokenizer.from_pretrained, tokenizer_flag, tokenizer_source, **hub)
    if tokenizer.pad_token is None:
        raise UsageError(f"The tokenizer of {tokenizer_source!r} has no pad token, which dynamic padding needs; set "
                         "one and save the tokenizer again.")
    if model_args.model_name_or_path is not None:
        config_flag = "--config_name" if model_args.config_name else "--model_name_or_path"
        config = _from_pretrained(AutoConfig.from_pretrained, config_flag,
                                  model_args.config_name or model_args.model_name_or_path, num_labels=num_labels,
                                  **hub)
    else:
        try:
            config = scratch_config(model_args, tokenizer, num_labels)
        except OSError as error:
            presets = ", ".join(list_presets())
            raise UsageError(f"--config_name {model_args.config_name!r} is not a preset ({presets}), a local file or "
                             f"folder, and loading it from the Hub failed: {first_line(error)}") from None
    # transformers 5 drops from_pretrained kwargs that are not already config attributes, finetuning_task included.
    if task_name is not None:
        config.finetuning_task = task_name
    config.problem_type = "regression" if label_names is None else "single_label_classification"
    if label_names is not None:
        config.label2id = {name: i for i, name in enumerate(label_names)}
        config.id2label = dict(enumerate(label_names))

    if model_args.model_name_or_path is not None:
        model = _from_pretrained(AutoModelForSequenceClassification.from_pretrained, "--model_name_or_path",
                                 model_args.model_name_or_path, config=config,
                                 ignore_mismatched_sizes=model_args.ignore_mismatched_sizes, **hub)
    else:
        model = AutoModelForSequenceClassification.from_config(config, trust_remote_code=model_args.trust_remote_code)
    return model, tokenizer


def finish_model_card(output_dir: str, task_name: str | None, metrics: dict[str, float], source: str | None,
                      data_name: str | None = None) -> None:
    """Complete the model card ``create_model_card`` wrote: say where the weights came from (it cannot tell a local
    checkpoint from a from-scratch model) and add a table of every evaluation number (it only lists the last
    evaluation, which for MNLI is the mismatched set). ``task_name=None``: data files, named by ``data_name``."""
    card = Path(output_dir) / "README.md"
    text = card.read_text() if card.is_file() else f"# {Path(output_dir).name}\n"
    if source is not None and os.path.isdir(source):
        origin = f"This model is a fine-tuned version of the local checkpoint `{Path(source).name}` on "
    else:
        origin = "This model was trained from scratch on "
    for generated in ("This model is a fine-tuned version of [](https://huggingface.co/) on ",
                      "This model was trained from scratch on "):
        text = text.replace(generated, origin)
    if metrics:
        rows = "\n".join(f"| {key} | {value:.4f} |" if isinstance(value, float) else f"| {key} | {value} |"
                         for key, value in sorted(metrics.items()))
        if task_name is not None:
            heading, how = f"GLUE {task_name.upper()} dev results", "Official GLUE metric definitions"
        else:
            heading, how = f"Results on {data_name or 'the validation file'}", "run_glue.py's metrics"
        text += (f"\n## {heading}\n\n{how}, computed offline with scikit-learn/scipy (`eval_results.json`).\n\n"
                 f"| metric | value |\n|---|---|\n{rows}\n")
    card.write_text(text)


def predict(trainer: Trainer, inputs: Inputs, datasets_by_split: dict, output_dir: str) -> dict[str, Path]:
    """Predict every test split and write it in the GLUE submission format (``index<TAB>prediction``, the
    benchmark's label strings, or a score for regression); returns the written files by split."""
    written = {}
    for split, dataset in datasets_by_split.items():
        logger.info("*** Predict %s ***", split)
        indices = list(dataset["idx"])
        output = trainer.predict(dataset, metric_key_prefix="predict")
        logits = output.predictions[0] if isinstance(output.predictions, tuple) else output.predictions
        predictions = np.squeeze(logits, axis=-1) if inputs.is_regression else np.argmax(logits, axis=-1)
        if trainer.is_world_process_zero():
            path = write_predictions(Path(output_dir) / inputs.prediction_files[split], indices, predictions,
                                     inputs.prediction_labels)
            logger.info("Wrote %d predictions to %s", len(indices), path)
            written[split] = path
    return written


def main(argv: list[str] | None = None) -> dict[str, float]:
    """Run finetuning, evaluation and/or prediction; returns the evaluation metrics (``eval_`` keys; empty without
    ``--do_eval``). Input errors raise :class:`UsageError` before training."""
    model_args, data_args, training_args = parse_args(argv)
    logging.basicConfig(format="%(asctime)s - %(levelname)s - %(name)s - %(message)s", datefmt="%H:%M:%S",
                        handlers=[logging.StreamHandler(sys.stdout)])
    log_level = training_args.get_process_log_level()
    logger.setLevel(log_level)
    datasets.utils.logging.set_verbosity(log_level)
    transformers.utils.logging.set_verbosity(log_level)
    if not (training_args.do_train or training_args.do_eval or training_args.do_predict):
        raise UsageError("Nothing to do: pass --do_train, --do_eval and/or --do_predict.")
    check_model_sources(model_args)
    set_seed(training_args.seed)

    inputs = load_inputs(data_args, training_args, model_args)
    task, raw = inputs.task, inputs.raw
    model, tokenizer = build_model_and_tokenizer(model_args, task.name if task else None, inputs.label_names)
    logger.info("%s: %.2fM parameters", type(model).__name__, model.num_parameters() / 1e6)

    max_length = min(data_args.max_seq_length, tokenizer.model_max_length)
    padding = "max_length" if data_args.pad_to_max_length else False

    def tokenize(batch):
        texts = [batch[column] for column in inputs.text_columns]
        return tokenizer(*texts, padding=padding, max_length=max_length, truncation=True)

    def limit(dataset, count: int | None):
        return dataset if count is None else dataset.select(range(min(count, len(dataset))))

    train_dataset = eval_datasets = predict_datasets = None
    if training_args.do_train:
        train_dataset = raw["train"]
        if data_args.train_subsample_seed is not None:
            train_dataset = train_dataset.shuffle(seed=data_args.train_subsample_seed)
        train_dataset = limit(train_dataset, data_args.max_train_samples)
    if training_args.do_eval:
        eval_datasets = {split: limit(raw[split], data_args.max_eval_samples) for split in inputs.eval_splits}
    if training_args.do_predict:
        predict_datasets = {split: limit(raw[split], data_args.max_predict_samples) for split in inputs.predict_splits}
    with training_args.main_process_first(desc="tokenisation"):
        def tokenized(dataset, what: str):
            return dataset.map(tokenize, batched=True, remove_columns=list(inputs.text_columns),
                               num_proc=data_args.preprocessing_num_workers, desc=f"tokenising {what}")

        if train_dataset is not None:
            train_dataset = tokenized(train_dataset, "train")
        if eval_datasets is not None:
            eval_datasets = {split: tokenized(ds, split) for split, ds in eval_datasets.items()}
        if predict_datasets is not None:
            predict_datasets = {split: tokenized(ds, split) for split, ds in predict_datasets.items()}

    # Dynamic padding is exact for TNN: the padding mask zeroes the token-mixer input at pad positions.
    collator = default_data_collator if data_args.pad_to_max_length else DataCollatorWithPadding(tokenizer)
    first_eval = next(iter(eval_datasets.values())) if eval_datasets else None
    trainer = Trainer(
        model=model,
        args=training_args,
        train_dataset=train_dataset,
        eval_dataset=first_eval,
        compute_metrics=make_compute_metrics(task, regression=inputs.is_regression),
        processing_class=tokenizer,
        data_collator=collator,
    )

    if training_args.do_train:
        train_result = trainer.train(resume_from_checkpoint=training_args.resume_from_checkpoint)
        trainer.save_model()
        metrics = dict(train_result.metrics, train_samples=len(train_dataset))
        trainer.log_metrics("train", metrics)
        trainer.save_metrics("train", metrics)
        trainer.save_state()

    results: dict[str, float] = {}
    if training_args.do_eval:
        for split, dataset in eval_datasets.items():
            logger.info("*** Evaluate %s ***", split)
            metrics = trainer.evaluate(eval_dataset=dataset)
            metrics["eval_samples"] = len(dataset)
            suffix = "_mm" if split == "validation_mismatched" else ""  # run_glue.py's naming for MNLI-mm
            results.update({f"{key}{suffix}": value for key, value in metrics.items()})
        trainer.log_metrics("eval", results)
        trainer.save_metrics("eval", results)

    if training_args.do_predict:
        predict(trainer, inputs, predict_datasets, training_args.output_dir)

    source = model_args.model_name_or_path
    if task is not None:
        card_kwargs = {"tasks": "text-classification", "language": "en", "dataset_tags": "glue",
                       "dataset_args": task.name, "dataset": inputs.description}
    else:
        card_kwargs = {"tasks": "text-classification", "dataset": inputs.description}
    if source is not None and not os.path.isdir(source):  # a Hub id; a local folder means nothing to card readers
        card_kwargs["finetuned_from"] = source
    if trainer.is_world_process_zero() and (training_args.do_train or training_args.do_eval):
        trainer.create_model_card(**card_kwargs)
        finish_model_card(training_args.output_dir, task.name if task else None, results, source,
                          inputs.eval_description)
        if training_args.push_to_hub:
            push_to_hub(training_args, task.name if task else None, inputs.description)
    return results


def push_to_hub(training_args: TrainingArguments, task_name: str | None, data_name: str | None = None) -> None:
    """Publish with the project's publishing code (what ``publish.py`` runs): an allow-listed folder with a model
    card whose model-index is read from ``eval_results.json``, then one upload. Unlike ``Trainer.push_to_hub`` it
    never uploads ``training_args.bin``, checkpoints, logs or prediction files. ``task_name=None``: a run on data
    files, named ``data_name`` in the card."""
    import tempfile

    import hub_publishing

    repo_id = training_args.hub_model_id or Path(training_args.output_dir).name
    if task_name is not None:
        data = hub_publishing.DatasetRef(hub_id="nyu-mll/glue", name=f"GLUE {task_name.upper()}", config=task_name,
                                         split="validation")
    else:
        data = hub_publishing.DatasetRef(name=data_name, split="validation")
    with tempfile.TemporaryDirectory() as tmp:
        _, commit = hub_publishing.publish_run(training_args.output_dir, repo_id, Path(tmp) / "hub",
                                               options=hub_publishing.CardOptions(dataset=data),
                                               private=bool(training_args.hub_private_repo))
    logger.info("pushed to %s", getattr(commit, "commit_url", commit))


def cli(argv: list[str] | None = None) -> None:
    """Entry point: an input error prints one ``finetune_glue.py: error: ...`` line and exits with status 2."""
    try:
        main(argv)
    except UsageError as error:
        print(f"finetune_glue.py: error: {error}", file=sys.stderr)
        raise SystemExit(2) from None


if __name__ == "__main__":
    cli()
