"""The ListOps entry points behind ``run_scripts/make_listops.py`` (:func:`make_data`: generate the task's files and
check them) and ``run_scripts/train_listops.py`` (:func:`train`: one model trained with the ``Trainer``, evaluated on
the validation and test splits)."""

from __future__ import annotations

import argparse
import sys
import time

import torch
from transformers import DataCollatorWithPadding, HfArgumentParser, Trainer, TrainingArguments, set_seed
from transformers.trainer_utils import IntervalStrategy

from .data import DEFAULT_COUNTS, MAX_LENGTH, MIN_LENGTH, build_listops_tokenizer, load_listops_split, make_listops
from .training import (
    ListOpsArguments,
    build_model,
    compute_metrics,
    curves,
    machine_load,
    plot_learning_curves,
    preprocess_logits_for_metrics,
)


def make_data_parser() -> argparse.ArgumentParser:
    """``make_listops.py``'s flags: the output folder, the rows per split, the seed and the length bounds."""
    parser = argparse.ArgumentParser(prog="make_listops.py",
                                     description="Generate the Long Range Arena ListOps task from its definition "
                                                 "and check what was written.")
    parser.add_argument("--output_dir", required=True, help="folder for basic_{train,val,test}.tsv")
    parser.add_argument("--num_train", type=int, default=DEFAULT_COUNTS["train"])
    parser.add_argument("--num_val", type=int, default=DEFAULT_COUNTS["val"])
    parser.add_argument("--num_test", type=int, default=DEFAULT_COUNTS["test"])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--min_length", type=int, default=MIN_LENGTH,
                        help="keep expressions longer than this (LRA: 500; lower it only for quick tests)")
    parser.add_argument("--max_length", type=int, default=MAX_LENGTH,
                        help="keep expressions shorter than this (LRA: 2000)")
    parser.add_argument("--no_progress", action="store_true", help="hide the progress bar")
    return parser


def make_data(argv: list[str] | None = None) -> None:
    """Write the three splits with :func:`.data.make_listops` (which reads them back and checks every row) and say
    what was checked."""
    args = make_data_parser().parse_args(argv)
    start = time.perf_counter()
    report = make_listops(args.output_dir, args.num_train, args.num_val, args.num_test, args.seed,
                          args.min_length, args.max_length, progress=not args.no_progress)
    print(f"wrote {report.counts} to {args.output_dir} in {time.perf_counter() - start:.1f} s; checked: lengths "
          f"{report.min_seen}..{report.max_seen} in ({args.min_length}, {args.max_length}), labels equal the "
          f"evaluated expressions, no duplicates across splits")


def training_arguments(argv: list[str] | None = None) -> tuple[ListOpsArguments, TrainingArguments]:
    """The task's and the Trainer's flags; evaluation every ``--eval_steps`` (else every ``--logging_steps``) unless
    a strategy is given, no pinned memory without CUDA."""
    parser = HfArgumentParser((ListOpsArguments, TrainingArguments))
    args, training_args = parser.parse_args_into_dataclasses(args=sys.argv[1:] if argv is None else argv)
    if training_args.eval_strategy == IntervalStrategy.NO:  # evaluate during training unless told otherwise
        training_args.eval_strategy = IntervalStrategy.STEPS
        training_args.eval_steps = training_args.eval_steps or training_args.logging_steps
    if not torch.cuda.is_available():
        training_args.dataloader_pin_memory = False  # nothing to pin to on a CPU-only machine
    return args, training_args


def train(argv: list[str] | None = None) -> dict:
    """Train one model on ListOps, evaluate it on the validation split (during training and at the end) and the test
    split, and write ``all_results.json`` (``train_*``, ``eval_*``, ``test_*`` and ``run_*`` entries),
    ``trainer_state.json``, the model, the tokenizer and ``learning_curve.png``; returns those results."""
    args, training_args = training_arguments(argv)
    if args.num_threads:
        torch.set_num_threads(args.num_threads)
    set_seed(training_args.seed)

    # Data: the three splits, tokenised with the task's word-level tokenizer (parentheses dropped, [CLS] first).
    tokenizer = build_listops_tokenizer()
    train_rows = load_listops_split(args.data_dir, "train", tokenizer, args.max_length, args.max_train_samples)
    # Evaluation sets in length order: batches of similar lengths pad little (accuracy does not depend on order).
    val = load_listops_split(args.data_dir, "val", tokenizer, args.max_length, args.max_eval_samples, True)
    test = load_listops_split(args.data_dir, "test", tokenizer, args.max_length, args.max_test_samples, True)
    print(f"rows: train {len(train_rows)}, val {len(val)}, test {len(test)}")

    # Model: a TNN from the preset with the chosen mixer, or BERT sized to the TNN's parameter count.
    model, sizes = build_model(args, len(tokenizer), tokenizer.pad_token_id)
    print(f"{args.model}: {sizes['parameters']:,} trainable parameters (TNN of the preset: "
          f"{sizes['tnn_parameters']:,})" + (f"; BERT sizes {sizes['bert_sizes']}, "
                                             f"{100 * (sizes['bert_vs_tnn'] - 1):+.2f}% vs the TNN"
                                             if "bert_sizes" in sizes else ""))

    trainer = Trainer(
        model=model, args=training_args, train_dataset=train_rows, eval_dataset=val,
        data_collator=DataCollatorWithPadding(tokenizer), processing_class=tokenizer,
        compute_metrics=compute_metrics, preprocess_logits_for_metrics=preprocess_logits_for_metrics)
    load_start = machine_load()
    train_metrics = trainer.train(resume_from_checkpoint=training_args.resume_from_checkpoint).metrics
    load_end = machine_load()
    periodic_eval = sum(e["eval_runtime"] for e in trainer.state.log_history if "eval_runtime" in e)
    trainer.save_model()
    trainer.save_state()
    trainer.save_metrics("train", train_metrics)

    val_metrics = trainer.evaluate(metric_key_prefix="eval")
    trainer.save_metrics("eval", val_metrics)
    start = time.perf_counter()
    test_metrics = trainer.evaluate(test, metric_key_prefix="test")
    test_metrics["test_wall_seconds"] = time.perf_counter() - start
    trainer.save_metrics("test", test_metrics)

    run = {"model": args.model, "preset": args.preset, "config_overrides": args.config_overrides,
           "parameters": sizes["parameters"], "tnn_parameters": sizes["tnn_parameters"],
           "steps": trainer.state.global_step,
           "batch": training_args.per_device_train_batch_size * training_args.gradient_accumulation_steps
           * max(1, training_args.world_size),
           "learning_rate": training_args.learning_rate, "seed": training_args.seed, "max_length": args.max_length,
           "train_rows": len(train_rows), "torch_threads": torch.get_num_threads(),
           "periodic_eval_seconds": periodic_eval, "load_start": load_start["load_avg_1min"],
           "load_end": load_end["load_avg_1min"], "cpu_count": load_start["cpu_count"]}
    if "bert_sizes" in sizes:
        run.update(bert_sizes=sizes["bert_sizes"], bert_vs_tnn=sizes["bert_vs_tnn"])
    run = {f"run_{key}": value for key, value in run.items()}
    trainer.save_metrics("run", run)  # all_results.json now holds train_*, eval_*, test_* and run_* entries

    plot_learning_curves({args.model: curves(trainer.state.log_history)},
                         f"{training_args.output_dir}/learning_curve.png", title=f"ListOps, {args.model}")
    print(f"test accuracy {100 * test_metrics['test_accuracy']:.2f}% after {run['run_steps']} steps of batch "
          f"{run['run_batch']} ({train_metrics['train_runtime']:.0f} s of training)")
    return {**train_metrics, **val_metrics, **test_metrics, **run}
