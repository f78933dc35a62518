#!/usr/bin/env python
"""Train a bidirectional TNN (dense, fd or ski mixer) or a matched-size BERT on LRA ListOps with the Trainer.

    python run_scripts/make_listops.py --output_dir data/listops
    python run_scripts/train_listops.py --data_dir data/listops --model tnn-ski --output_dir runs/listops_ski \\
        --max_steps 1000 --per_device_train_batch_size 8 --learning_rate 1e-3 --eval_steps 100 --save_strategy no

Evaluates on the validation split (its first ``--max_eval_samples`` rows if given) every ``--eval_steps`` and at the
end, then on the test split; writes ``all_results.json``, ``trainer_state.json``, the model and tokenizer, and
``learning_curve.png`` (train loss and validation accuracy against the step) to ``--output_dir``.
"""

from __future__ import annotations

import sys
import time

import torch
from transformers import DataCollatorWithPadding, HfArgumentParser, Trainer, TrainingArguments, set_seed
from transformers.trainer_utils import IntervalStrategy

from modeling_tnn.recipes.listops.data import build_listops_tokenizer, load_listops_split
from modeling_tnn.recipes.listops.training import (
    ListOpsArguments,
    build_model,
    compute_metrics,
    curves,
    machine_load,
    plot_learning_curves,
    preprocess_logits_for_metrics,
)


def main(argv: list[str] | None = None) -> dict:
    parser = HfArgumentParser((ListOpsArguments, TrainingArguments))
    args, training_args = parser.parse_args_into_dataclasses(args=sys.argv[1:] if argv is None else argv)
    if training_args.eval_strategy == IntervalStrategy.NO:  # evaluate during training unless told otherwise
        training_args.eval_strategy = IntervalStrategy.STEPS
        training_args.eval_steps = training_args.eval_steps or training_args.logging_steps
    if not torch.cuda.is_available():
        training_args.dataloader_pin_memory = False  # nothing to pin to on a CPU-only machine
    if args.num_threads:
        torch.set_num_threads(args.num_threads)
    set_seed(training_args.seed)

    # Data: the three splits, tokenised with the task's word-level tokenizer (parentheses dropped, [CLS] first).
    tokenizer = build_listops_tokenizer()
    train = load_listops_split(args.data_dir, "train", tokenizer, args.max_length, args.max_train_samples)
    # Evaluation sets in length order: batches of similar lengths pad little (accuracy does not depend on order).
    val = load_listops_split(args.data_dir, "val", tokenizer, args.max_length, args.max_eval_samples, True)
    test = load_listops_split(args.data_dir, "test", tokenizer, args.max_length, args.max_test_samples, True)
    print(f"rows: train {len(train)}, val {len(val)}, test {len(test)}")

    # Model: a TNN from the preset with the chosen mixer, or BERT sized to the TNN's parameter count.
    model, sizes = build_model(args, len(tokenizer), tokenizer.pad_token_id)
    print(f"{args.model}: {sizes['parameters']:,} trainable parameters (TNN of the preset: "
          f"{sizes['tnn_parameters']:,})" + (f"; BERT sizes {sizes['bert_sizes']}, "
                                             f"{100 * (sizes['bert_vs_tnn'] - 1):+.2f}% vs the TNN"
                                             if "bert_sizes" in sizes else ""))

    trainer = Trainer(
        model=model, args=training_args, train_dataset=train, eval_dataset=val,
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

    history = trainer.state.log_history
    run = {"model": args.model, "preset": args.preset, "config_overrides": args.config_overrides,
           "parameters": sizes["parameters"], "tnn_parameters": sizes["tnn_parameters"],
           "steps": trainer.state.global_step,
           "batch": training_args.per_device_train_batch_size * training_args.gradient_accumulation_steps
           * max(1, training_args.world_size),
           "learning_rate": training_args.learning_rate, "seed": training_args.seed, "max_length": args.max_length,
           "train_rows": len(train), "torch_threads": torch.get_num_threads(),
           "periodic_eval_seconds": periodic_eval, "load_start": load_start["load_avg_1min"],
           "load_end": load_end["load_avg_1min"], "cpu_count": load_start["cpu_count"]}
    if "bert_sizes" in sizes:
        run.update(bert_sizes=sizes["bert_sizes"], bert_vs_tnn=sizes["bert_vs_tnn"])
    run = {f"run_{key}": value for key, value in run.items()}
    trainer.save_metrics("run", run)  # all_results.json now holds train_*, eval_*, test_* and run_* entries

    plot_learning_curves({args.model: curves(history)}, f"{training_args.output_dir}/learning_curve.png",
                         title=f"ListOps, {args.model}")
    print(f"test accuracy {100 * test_metrics['test_accuracy']:.2f}% after {run['run_steps']} steps of batch "
          f"{run['run_batch']} ({train_metrics['train_runtime']:.0f} s of training)")
    return {**train_metrics, **val_metrics, **test_metrics, **run}


if __name__ == "__main__":
    main()
