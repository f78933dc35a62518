"""The quality benchmark (``run_scripts/bench_quality.py``) builds each model's ``train_clm`` run as an arguments
object: the same run as the flags it has always passed, recorded as a command line that parses back into it."""

from __future__ import annotations

import json

import pytest

from modeling_tnn.recipes.benchmarks import quality
from modeling_tnn.recipes.common.run_files import RESULTS_FILE
from modeling_tnn.recipes.pretraining.arguments import parse_args
from tests.support import data_dir


def test_each_model_trains_with_the_benchmarks_train_clm_flags(tmp_path):
    settings = quality.parse_settings(["--steps", "90", "--block_size", "32", "--batch_size", "4", "--learning_rate",
                                       "0.001", "--hidden_size", "24", "--layers", "2", "--max_eval_tokens", "1024",
                                       "--seed", "3"])
    # What every model's run was given as train_clm.py flags (rerun: --overwrite_output_dir).
    shared = ["--overwrite_output_dir", "--tokenizer_name", str(tmp_path / "tokenizer"), "--block_size", "32",
              "--per_device_train_batch_size", "4", "--per_device_eval_batch_size", "8", "--learning_rate", "0.001",
              "--weight_decay", "0.01", "--lr_scheduler_type", "cosine", "--num_warmup_steps", "9",
              "--max_train_steps", "90", "--eval_steps", "90", "--logging_steps", "3", "--max_eval_samples", "32",
              "--seed", "3", "--report_to", "none"]
    tnn = "dropout=0.0,hidden_size=24,num_hidden_layers=2,token_mixer="
    models = {"tnn_dense": ["--config_name", "small", "--config_overrides", tnn + "dense"],
              "tnn_fd": ["--config_name", "small", "--config_overrides", tnn + "fd"],
              "gpt2": ["--config_name", str(tmp_path / "gpt2_config.json")]}
    assert set(models) == set(quality.MODELS)
    for name, flags in models.items():
        built = quality.training_arguments(settings, quality.model_arguments(name, settings, tmp_path),
                                           tmp_path / name)
        assert built == parse_args("clm", shared + flags + ["--output_dir", str(tmp_path / name)]), name
        assert parse_args("clm", built.argv()) == built


def test_unknown_models_are_usage_errors(capsys):
    with pytest.raises(SystemExit):
        quality.parse_settings(["--models", "tnn_dense,lstm"])
    assert "--models: unknown ['lstm']" in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_tiny_comparison_trains_through_train_clm_and_records_each_run(tmp_path, monkeypatch):
    folder = data_dir()
    if folder is None or not (folder / "tinyshakespeare" / "input.txt").is_file():
        pytest.skip("no tinyshakespeare in the data folder (TNN_DATA_DIR or shared/data)")
    monkeypatch.setenv("TNN_DATA_DIR", str(folder))
    report = quality.main(["--datasets", "tinyshakespeare", "--models", "tnn_dense,gpt2", "--steps", "2",
                           "--block_size", "16", "--hidden_size", "16", "--layers", "1", "--max_eval_tokens", "256",
                           "--throughput_rounds", "0", "--out", str(tmp_path / "out"),
                           "--work_dir", str(tmp_path / "work")])
    section = report["datasets"]["tinyshakespeare"]
    assert set(section["models"]) == {"tnn_dense", "gpt2"}
    for name, entry in section["models"].items():
        run_dir = tmp_path / "work" / "tinyshakespeare" / name
        assert json.loads((run_dir / RESULTS_FILE).read_text())["eval_loss"] == entry["eval_loss"]
        recorded = parse_args("clm", entry["argv"])  # the run's train_clm.py command line
        assert recorded.run.output_dir == str(run_dir) and recorded.training.max_train_steps == 2
        assert set(entry["sliding"]) == {"16", "32", "64", "128"}
    assert "full" in section["models"]["tnn_dense"] and "full" not in section["models"]["gpt2"]
    assert {path.name for path in (tmp_path / "out").iterdir()} == {"quality.json", "quality_tinyshakespeare.png"}
