"""The command line of ``finetune_glue.py``: transformers' ``run_glue.py`` arguments (``ModelArguments``,
``DataTrainingArguments``) plus a local ``--glue_dir``."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field

from transformers import (
    HfArgumentParser,
    TrainingArguments,
)

from modeling_tnn import list_presets

from ..common.flag_checks import UsageError
from ..common.run_files import PREDICTIONS_FILE
from .data_files import data_file_format
from .tasks import get_task



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
    padding_free: bool = field(
        default=False,
        metadata={"help": "Pack each batch into one row without padding (position_ids restarting at every example, "
                          "one label per example; TNN models only): each example is still mixed and pooled alone, "
                          "and a step costs its tokens instead of its longest row times the batch "
                          "(docs/packed-sequences.md)."},
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
        if self.padding_free and self.pad_to_max_length:
            raise UsageError("--padding_free packs each batch without padding; it cannot be combined with "
                             "--pad_to_max_length.")
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
