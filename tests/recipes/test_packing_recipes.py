"""Padding-free training in the recipes: finetune_glue.py --padding_free (our flattening collator, one label per
example) gives the padded run's metrics, pretraining --packing documents keeps each document apart inside a block, a
Trainer with transformers' DataCollatorWithFlattening trains a TNN, and the packing benchmark runs at toy size."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import DataCollatorWithFlattening, Trainer, TrainingArguments

from modeling_tnn import TnnForCausalLM, TnnForMaskedLM
from modeling_tnn.recipes.benchmarks import packing as bench_packing
from modeling_tnn.recipes.common.flag_checks import UsageError
from modeling_tnn.recipes.common.flattening import DocumentFlatteningCollator
from modeling_tnn.recipes.glue import finetuning as glue_finetuning
from modeling_tnn.recipes.glue.arguments import parse_args as glue_args
from modeling_tnn.recipes.pretraining.data import group_texts
from modeling_tnn.recipes.pretraining.evaluation import InputBuilder

from tests.recipes.test_glue import COMMON, classification_rows, write_rows
from tests.recipes.test_glue import tiny_mlm_checkpoint  # noqa: F401 (a fixture the finetuning test takes)
from tests.support import TINY_PRETRAINING, run_pretraining, tiny_config


def test_the_flattening_collator_keeps_one_label_per_example():
    batch = DocumentFlatteningCollator()([{"input_ids": [5, 6, 7], "attention_mask": [1, 1, 1], "label": 1},
                                          {"input_ids": [8, 9], "attention_mask": [1, 1], "label": 0}])
    assert batch["input_ids"].tolist() == [[5, 6, 7, 8, 9]]
    assert batch["position_ids"].tolist() == [[0, 1, 2, 0, 1]]
    assert batch["labels"].tolist() == [1, 0] and batch["labels"].dtype == torch.long and set(batch) == {
        "input_ids", "position_ids", "labels"}
    regression = DocumentFlatteningCollator()([{"input_ids": [5], "label": 0.5}, {"input_ids": [6], "label": 2}])
    assert regression["labels"].dtype == torch.float


def test_padding_free_cannot_be_combined_with_padding_to_max_length(tmp_path):
    with pytest.raises(UsageError, match="--padding_free"):
        glue_args(["--task_name", "sst2", "--output_dir", str(tmp_path), "--padding_free", "--pad_to_max_length"])


@pytest.mark.parametrize("train", [False, pytest.param(True, marks=pytest.mark.slow)])
def test_padding_free_finetuning_gives_the_padded_metrics(tmp_path, tiny_mlm_checkpoint, train):
    """The same checkpoint and data, padded or packed: the same evaluation (and, after the same steps, the same
    model within float32 rounding), since every example is mixed and pooled alone either way."""
    files = {"--train_file": write_rows(tmp_path / "train.csv", classification_rows()),
             "--validation_file": write_rows(tmp_path / "valid.csv", classification_rows(2))}
    results = {}
    for padding_free in (False, True):
        args = ["--model_name_or_path", str(tiny_mlm_checkpoint), *(f"{k}={v}" for k, v in files.items()),
                "--output_dir", str(tmp_path / f"out{padding_free}"), *COMMON, "--per_device_train_batch_size", "4",
                "--max_steps", "2" if train else "0", *(["--padding_free"] if padding_free else [])]
        if not train:
            args.remove("--do_train")
        results[padding_free] = glue_finetuning.main(args)
    assert results[True]["eval_samples"] == results[False]["eval_samples"] == 8
    assert results[True]["eval_accuracy"] == results[False]["eval_accuracy"]
    assert results[True]["eval_loss"] == pytest.approx(results[False]["eval_loss"], rel=1e-4)


def test_documents_packing_restarts_positions_at_every_row_and_block():
    rows = {"input_ids": [[1, 2, 3], [4, 5, 6, 7, 8], [9, 10]]}
    assert "position_ids" not in group_texts(rows, 4)  # the default concatenation is run_clm's
    grouped = group_texts(rows, 4, documents=True)
    assert grouped["input_ids"] == [[1, 2, 3, 4], [5, 6, 7, 8]]
    assert grouped["position_ids"] == [[0, 1, 2, 0], [0, 1, 2, 3]]  # row 2 continues as its own document


def test_documents_packing_masks_the_causal_loss_across_boundaries(tokenizer):
    batch = {"input_ids": torch.tensor([[1, 2, 3, 4]]), "position_ids": torch.tensor([[0, 1, 2, 0]])}
    inputs = InputBuilder("clm", tokenizer, None)(batch)
    assert inputs["labels"].tolist() == [[-100, 2, 3, -100]] and inputs["position_ids"] is batch["position_ids"]
    model = TnnForCausalLM(tiny_config(vocab_size=len(tokenizer))).eval()
    alone = model(torch.tensor([[1, 2, 3]]), labels=torch.tensor([[1, 2, 3]])).loss
    assert model(**inputs).loss.item() == pytest.approx(alone.item(), rel=1e-5)  # the one-token document adds none


@pytest.mark.parametrize("model_class", [TnnForCausalLM, TnnForMaskedLM])
def test_a_trainer_with_transformers_flattening_collator_trains(tmp_path, model_class):
    torch.manual_seed(0)
    model = model_class(tiny_config(vocab_size=64))
    generator = torch.Generator().manual_seed(0)
    rows = [{"input_ids": torch.randint(1, 64, (int(n),), generator=generator).tolist()}
            for n in torch.randint(3, 12, (32,), generator=generator)]
    seen = []
    model.register_forward_pre_hook(lambda module, args, kwargs: seen.append(sorted(kwargs)), with_kwargs=True)
    args = TrainingArguments(output_dir=str(tmp_path), max_steps=6, per_device_train_batch_size=8, learning_rate=3e-3,
                             report_to=[], save_strategy="no", logging_steps=1, disable_tqdm=True, use_cpu=True)
    trainer = Trainer(model=model, args=args, train_dataset=rows,
                      data_collator=DataCollatorWithFlattening(return_tensors="pt"))
    losses = [log["loss"] for log in trainer.train() and trainer.state.log_history if "loss" in log]
    assert len(losses) == 6 and all(torch.isfinite(torch.tensor(losses)))
    assert losses[-1] < losses[0]
    assert all("position_ids" in keys and "num_items_in_batch" in keys for keys in seen)


def test_the_packing_benchmark_runs_at_toy_size(tmp_path):
    bench_packing.main(["--rounds", "1", "--batch_size", "6", "--hidden_size", "32", "--equal_length", "4",
                        "--output_dir", str(tmp_path)])
    record = json.loads((tmp_path / "results.json").read_text())
    info = record["results"]["info"]
    assert len(info["lengths"]) == 6 and 0 <= info["padding_fraction"] < 1
    assert {"speedup SST-2 lengths", "speedup equal lengths"} <= set(info)
    assert "padding fraction" in (tmp_path / "table.md").read_text()


@pytest.mark.parametrize("task", ["clm", "mlm"])
def test_pretraining_with_documents_packing_trains(tmp_path, task):
    from modeling_tnn.recipes.pretraining import arguments, setup

    lines = [f"the {word} sat on the mat {i}" for i in range(60) for word in ("cat", "dog")]
    (tmp_path / "train.txt").write_text("\n".join(lines[:100]) + "\n")
    (tmp_path / "valid.txt").write_text("\n".join(lines[100:]) + "\n")
    argv = TINY_PRETRAINING + ["--train_file", str(tmp_path / "train.txt"), "--validation_file",
                               str(tmp_path / "valid.txt"), "--output_dir", str(tmp_path / "out"),
                               "--max_train_steps", "2", "--per_device_train_batch_size", "4", "--packing", "documents"]
    outcome = run_pretraining(task, argv)
    results = json.loads((tmp_path / "out" / "all_results.json").read_text())
    assert outcome is not None and torch.isfinite(torch.tensor(results["eval_loss"]))
    again = [tmp_path / "again" if value == str(tmp_path / "out") else value for value in argv]
    session = setup.setup(arguments.parse_args(task, [str(value) for value in again]), task)
    batch = next(iter(session.train_dataloader))
    inputs = session.build_inputs(batch)
    assert "position_ids" in inputs and bool((inputs["position_ids"][:, 0] == 0).all())
    assert bool((inputs["position_ids"][:, 1:] == 0).any())  # rows shorter than a block: restarts inside blocks
    if task == "clm":
        assert bool((inputs["labels"][inputs["position_ids"] == 0] == -100).all())
    with pytest.raises(SystemExit):  # argparse: "argument --packing: invalid choice: 'rows'"
        arguments.parse_args(task, TINY_PRETRAINING + ["--packing", "rows"])
