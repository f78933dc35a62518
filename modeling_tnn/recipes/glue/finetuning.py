"""Finetuning with the ``Trainer`` on a GLUE task or data files (``finetune_glue.py``): model and tokenizer from a
checkpoint or from scratch, training, evaluation, predictions and the card."""

from __future__ import annotations

import json
import logging
import os
import sys
from pathlib import Path

import datasets
import numpy as np
import transformers
from transformers import (
    AutoConfig,
    AutoModelForSequenceClassification,
    AutoTokenizer,
    DataCollatorWithPadding,
    PretrainedConfig,
    Trainer,
    TrainingArguments,
    default_data_collator,
    set_seed,
)

from modeling_tnn import list_presets, load_preset

from ..common.flag_checks import UsageError, check_local_source, exit_on_usage_error, first_line
from ..common.flattening import DocumentFlatteningCollator
from ..common.run_files import BENCHMARK_FILE, TOKENIZER_FILES
from ..hub.run_inspection import DatasetRef
from ..hub.upload import push_finished_run
from .arguments import ModelArguments, parse_args
from .inputs import Inputs, load_inputs
from .metrics import make_compute_metrics
from .tasks import RESULT_SUFFIXES, GlueTask, write_predictions

logger = logging.getLogger(__name__)


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
        config.update_from_string(model_args.config_overrides)  # TnnConfig validates the batch itself
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
    logging.getLogger(__package__).setLevel(log_level)  # this module and the data modules it calls
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

    # Dynamic padding is exact for TNN: the padding mask zeroes the token-mixer input at pad positions; packing too:
    # each example of a packed row is mixed and pooled alone.
    collator = default_data_collator if data_args.pad_to_max_length else DataCollatorWithPadding(tokenizer)
    if data_args.padding_free:
        if getattr(model.config, "model_type", None) != "tnn":
            raise UsageError(f"--padding_free: {type(model).__name__} does not pool packed examples apart; use a TNN "
                             "model or drop --padding_free.")
        collator = DocumentFlatteningCollator()
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
    if training_args.fsdp and not trainer.is_fsdp_enabled:  # Accelerate hands Trainer FSDP on GPUs only
        logger.warning("--fsdp: Trainer runs these %d processes as %s (DDP), unsharded: Accelerate gives Trainer "
                       "FSDP on GPUs only (docs/distributed.md).", training_args.world_size,
                       trainer.accelerator.distributed_type.value)

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
            suffix = RESULT_SUFFIXES.get(split, "")
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
        write_benchmark_record(training_args.output_dir, task)
        finish_model_card(training_args.output_dir, task.name if task else None, results, source,
                          inputs.eval_description)
        if training_args.push_to_hub:
            push_to_hub(training_args, task.name if task else None, inputs.description)
    return results


def write_benchmark_record(output_dir: str, task: GlueTask | None) -> None:
    """Leave the GLUE task's :class:`BenchmarkRecord` in the run folder for its model card (publishing reads it from
    there); a run on data files has none, so a record left by an earlier run in the same folder goes."""
    if task is not None:
        task.benchmark_record().write(output_dir)
    else:
        (Path(output_dir) / BENCHMARK_FILE).unlink(missing_ok=True)


def cli(argv: list[str] | None = None) -> None:
    """Entry point: an input error prints one ``finetune_glue.py: error: ...`` line and exits with status 2."""
    with exit_on_usage_error("finetune_glue.py"):
        main(argv)


def push_to_hub(training_args: TrainingArguments, task_name: str | None, data_name: str | None = None) -> None:
    """``--push_to_hub``: publish with the project's publishing code, a model card whose model-index is read from
    ``eval_results.json``. Unlike ``Trainer.push_to_hub`` it never uploads ``training_args.bin``, checkpoints, logs
    or prediction files. ``task_name=None``: a run on data files, named ``data_name`` in the card."""
    repo_id = training_args.hub_model_id or Path(training_args.output_dir).name
    if task_name is not None:
        data = DatasetRef(hub_id="nyu-mll/glue", name=f"GLUE {task_name.upper()}", config=task_name,
                          split="validation")
    else:
        data = DatasetRef(name=data_name, split="validation")
    url = push_finished_run(training_args.output_dir, repo_id, data, private=bool(training_args.hub_private_repo))
    logger.info("pushed to %s", url)


if __name__ == "__main__":  # the GLUE suite runs each finetuning as `python -m` of this module
    cli()
