#!/usr/bin/env python
"""Finetune a TNN (or any ``AutoModelForSequenceClassification`` model) on a GLUE task with ``Trainer``.

It follows the conventions of HF's ``run_glue.py``: ``HfArgumentParser`` over model, data and ``TrainingArguments``
(or one ``.json`` file holding them all), ``--task_name`` for the nine GLUE tasks, dynamic padding with
``DataCollatorWithPadding``, ``eval_results.json`` with ``eval_`` prefixes, and a model card in the output folder.
It works offline: data comes from ``--glue_dir`` (the official GLUE tsv layout; for this project
``$TNN_DATA_DIR/glue``) and the metrics are computed with scikit-learn/scipy (``glue_data.py``), never
``evaluate.load``. Without ``--glue_dir`` the Hub dataset ``--dataset_name`` (``nyu-mll/glue``) is loaded.

Examples::

    # from a pretrained (masked LM) checkpoint folder holding a tokenizer
    python run_scripts/finetune_glue.py --model_name_or_path outputs/mlm --task_name sst2 \\
        --glue_dir "$TNN_DATA_DIR/glue" --do_train --do_eval --output_dir outputs/glue/sst2
    # from scratch: a preset (or config path) and a tokenizer folder
    python run_scripts/finetune_glue.py --config_name small --tokenizer_name outputs/mlm --task_name rte ...

MNLI is evaluated on the matched and the mismatched dev sets (the latter's metrics get an ``_mm`` suffix).
"""

from __future__ import annotations

import json
import logging
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

import datasets
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
from glue_data import get_task, load_glue_local, make_compute_metrics  # noqa: E402

logger = logging.getLogger(__name__)


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
    """Which GLUE task, where its data is, and how it is tokenised and subsampled."""

    task_name: str = field(metadata={"help": "One of cola, sst2, mrpc, qqp, stsb, mnli, qnli, rte, wnli."})
    glue_dir: str | None = field(
        default=None,
        metadata={"help": "Folder in the official GLUE layout (CoLA/train.tsv, SST-2/dev.tsv, ...), e.g. "
                          "$TNN_DATA_DIR/glue. Without it the Hub dataset --dataset_name is used."},
    )
    dataset_name: str = field(default="nyu-mll/glue", metadata={"help": "Hub dataset used when --glue_dir is unset."})
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
    train_subsample_seed: int | None = field(
        default=None,
        metadata={"help": "Shuffle the training rows with this seed before --max_train_samples keeps the first N "
                          "(the default keeps the file's first N rows, as run_glue.py does)."},
    )
    preprocessing_num_workers: int | None = field(default=None, metadata={"help": "Processes for tokenisation."})

    def __post_init__(self) -> None:
        self.task_name = get_task(self.task_name).name  # raises ValueError naming an unknown task
        if self.max_seq_length < 1:
            raise ValueError(f"--max_seq_length must be positive, got {self.max_seq_length}.")
        for name in ("max_train_samples", "max_eval_samples"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"--{name} must be positive, got {value}.")


def parse_args(argv: list[str] | None = None) -> tuple[ModelArguments, DataTrainingArguments, TrainingArguments]:
    """Parse ``argv`` (default ``sys.argv[1:]``), or a single ``.json`` file holding all the arguments."""
    parser = HfArgumentParser((ModelArguments, DataTrainingArguments, TrainingArguments))
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) == 1 and argv[0].endswith(".json"):
        return parser.parse_json_file(json_file=os.path.abspath(argv[0]))
    return parser.parse_args_into_dataclasses(args=argv)


def load_raw_datasets(data_args: DataTrainingArguments, splits: list[str], cache_dir: str | None):
    """The task's labelled splits, from the local tsv files or from the Hub."""
    task = get_task(data_args.task_name)
    if data_args.glue_dir is not None:
        return load_glue_local(task, data_args.glue_dir, splits)
    from datasets import load_dataset

    raw = load_dataset(data_args.dataset_name, task.name, cache_dir=cache_dir)
    return datasets.DatasetDict({split: raw[split] for split in splits})


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


def build_model_and_tokenizer(model_args: ModelArguments, task_name: str, label_names: list[str] | None):
    """Tokenizer and sequence-classification model, from a checkpoint or from scratch, with the task's labels."""
    num_labels = 1 if label_names is None else len(label_names)
    hub = {"cache_dir": model_args.cache_dir, "trust_remote_code": model_args.trust_remote_code}
    if model_args.model_name_or_path is None and (model_args.config_name is None or model_args.tokenizer_name is None):
        raise ValueError("Give --model_name_or_path, or --config_name and --tokenizer_name to train from scratch.")
    if model_args.model_name_or_path is not None and model_args.config_overrides:
        raise ValueError("--config_overrides only applies from scratch (without --model_name_or_path).")

    tokenizer = AutoTokenizer.from_pretrained(model_args.tokenizer_name or model_args.model_name_or_path, **hub)
    if tokenizer.pad_token is None:
        raise ValueError(f"The tokenizer of {model_args.tokenizer_name or model_args.model_name_or_path!r} has no "
                         "pad token, which dynamic padding needs; set one and save the tokenizer again.")
    if model_args.model_name_or_path is not None:
        config = AutoConfig.from_pretrained(model_args.config_name or model_args.model_name_or_path,
                                            num_labels=num_labels, **hub)
    else:
        config = scratch_config(model_args, tokenizer, num_labels)
    # transformers 5 drops from_pretrained kwargs that are not already config attributes, finetuning_task included.
    config.finetuning_task = task_name
    config.problem_type = "regression" if label_names is None else "single_label_classification"
    if label_names is not None:
        config.label2id = {name: i for i, name in enumerate(label_names)}
        config.id2label = dict(enumerate(label_names))

    if model_args.model_name_or_path is not None:
        model = AutoModelForSequenceClassification.from_pretrained(
            model_args.model_name_or_path, config=config, ignore_mismatched_sizes=model_args.ignore_mismatched_sizes,
            **hub)
    else:
        model = AutoModelForSequenceClassification.from_config(config, trust_remote_code=model_args.trust_remote_code)
    return model, tokenizer


def finish_model_card(output_dir: str, task_name: str, metrics: dict[str, float], source: str | None) -> None:
    """Complete the model card ``create_model_card`` wrote: say where the weights came from (it cannot tell a local
    checkpoint from a from-scratch model) and add a table of every evaluation number (it only lists the last
    evaluation, which for MNLI is the mismatched set)."""
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
        text += (f"\n## GLUE {task_name.upper()} dev results\n\nOfficial GLUE metric definitions, computed offline "
                 f"with scikit-learn/scipy (`eval_results.json`).\n\n| metric | value |\n|---|---|\n{rows}\n")
    card.write_text(text)


def main(argv: list[str] | None = None) -> dict[str, float]:
    """Run finetuning and/or evaluation; returns the evaluation metrics (``eval_`` keys; empty without
    ``--do_eval``)."""
    model_args, data_args, training_args = parse_args(argv)
    logging.basicConfig(format="%(asctime)s - %(levelname)s - %(name)s - %(message)s", datefmt="%H:%M:%S",
                        handlers=[logging.StreamHandler(sys.stdout)])
    log_level = training_args.get_process_log_level()
    logger.setLevel(log_level)
    datasets.utils.logging.set_verbosity(log_level)
    transformers.utils.logging.set_verbosity(log_level)
    if not (training_args.do_train or training_args.do_eval):
        raise ValueError("Nothing to do: pass --do_train and/or --do_eval.")
    set_seed(training_args.seed)

    task = get_task(data_args.task_name)
    splits = (["train"] if training_args.do_train else []) + (list(task.eval_splits) if training_args.do_eval else [])
    raw = load_raw_datasets(data_args, splits, model_args.cache_dir)
    label_names = None if task.is_regression else raw[splits[0]].features["label"].names
    model, tokenizer = build_model_and_tokenizer(model_args, task.name, label_names)
    logger.info("%s: %.2fM parameters", type(model).__name__, model.num_parameters() / 1e6)

    max_length = min(data_args.max_seq_length, tokenizer.model_max_length)
    padding = "max_length" if data_args.pad_to_max_length else False

    def tokenize(batch):
        texts = [batch[column] for column in task.text_columns]
        return tokenizer(*texts, padding=padding, max_length=max_length, truncation=True)

    text_columns = [c for c in raw[splits[0]].column_names if c != "label"]
    train_dataset = eval_datasets = None
    if training_args.do_train:
        train_dataset = raw["train"]
        if data_args.train_subsample_seed is not None:
            train_dataset = train_dataset.shuffle(seed=data_args.train_subsample_seed)
        if data_args.max_train_samples is not None:
            train_dataset = train_dataset.select(range(min(data_args.max_train_samples, len(train_dataset))))
    if training_args.do_eval:
        eval_datasets = {}
        for split in task.eval_splits:
            dataset = raw[split]
            if data_args.max_eval_samples is not None:
                dataset = dataset.select(range(min(data_args.max_eval_samples, len(dataset))))
            eval_datasets[split] = dataset
    with training_args.main_process_first(desc="tokenisation"):
        if train_dataset is not None:
            train_dataset = train_dataset.map(tokenize, batched=True, remove_columns=text_columns,
                                              num_proc=data_args.preprocessing_num_workers, desc="tokenising train")
        if eval_datasets is not None:
            eval_datasets = {split: ds.map(tokenize, batched=True, remove_columns=text_columns,
                                           num_proc=data_args.preprocessing_num_workers, desc=f"tokenising {split}")
                             for split, ds in eval_datasets.items()}

    # Dynamic padding is exact for TNN: the padding mask zeroes the token-mixer input at pad positions.
    collator = default_data_collator if data_args.pad_to_max_length else DataCollatorWithPadding(tokenizer)
    first_eval = next(iter(eval_datasets.values())) if eval_datasets else None
    trainer = Trainer(
        model=model,
        args=training_args,
        train_dataset=train_dataset,
        eval_dataset=first_eval,
        compute_metrics=make_compute_metrics(task),
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

    source = model_args.model_name_or_path
    card_kwargs = {"tasks": "text-classification", "language": "en", "dataset_tags": "glue",
                   "dataset_args": task.name, "dataset": f"GLUE {task.name.upper()}"}
    if source is not None and not os.path.isdir(source):  # a Hub id; a local folder means nothing to card readers
        card_kwargs["finetuned_from"] = source
    if trainer.is_world_process_zero():
        trainer.create_model_card(**card_kwargs)
        finish_model_card(training_args.output_dir, task.name, results, source)
        if training_args.push_to_hub:
            push_to_hub(training_args, task.name)
    return results


def push_to_hub(training_args: TrainingArguments, task_name: str) -> None:
    """Publish with the project's publishing code (what ``publish.py`` runs): an allow-listed folder with a model
    card whose model-index is read from ``eval_results.json``, then one upload. Unlike ``Trainer.push_to_hub`` it
    never uploads ``training_args.bin``, checkpoints or logs."""
    import tempfile

    import hub_publishing

    repo_id = training_args.hub_model_id or Path(training_args.output_dir).name
    data = hub_publishing.DatasetRef(hub_id="nyu-mll/glue", name=f"GLUE {task_name.upper()}", config=task_name,
                                     split="validation")
    with tempfile.TemporaryDirectory() as tmp:
        _, commit = hub_publishing.publish_run(training_args.output_dir, repo_id, Path(tmp) / "hub",
                                               options=hub_publishing.CardOptions(dataset=data),
                                               private=bool(training_args.hub_private_repo))
    logger.info("pushed to %s", getattr(commit, "commit_url", commit))


if __name__ == "__main__":
    main()
