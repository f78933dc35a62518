"""The Accelerate pretraining scripts (run_scripts/train_clm.py, train_mlm.py over modeling_tnn.recipes): input errors
before training, short runs, exact resume, atomic checkpoints, the progress log."""

from __future__ import annotations

import json
import math
import shutil
import sys
from pathlib import Path

import pytest
import torch

from modeling_tnn.recipes.hub import folder as hub_folder
from modeling_tnn.recipes.hub import upload as hub_upload
from modeling_tnn.recipes.pretraining import arguments as lm_arguments
from modeling_tnn.recipes.pretraining import checkpoints
from modeling_tnn.recipes.pretraining import cpu_launch
from modeling_tnn.recipes.pretraining import evaluation as lm_evaluation
from modeling_tnn.recipes.pretraining import setup as lm_setup
from modeling_tnn.recipes.pretraining import training as lm_training

from tests.support import TINY_PRETRAINING as TINY
from tests.support import assert_same_weights, weights, write_text_pair
from tests.support import run_pretraining as run


@pytest.fixture(scope="module")
def text_files(tmp_path_factory) -> tuple[Path, Path]:
    # Small on purpose: a few dozen 16-token blocks, so that a handful of steps crosses epoch boundaries.
    return write_text_pair(tmp_path_factory.mktemp("text"), 4000, 2000)


# ----------------------------------------------------------------------------------------------------------------
# Input errors, before any training
# ----------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("flags, message", [
    (["--train_file", "no/such/file.txt"], "--train_file 'no/such/file.txt' does not exist"),
    (["--config_name", "no_such_preset"], "is not a preset"),
    (["--config_name", "missing/config.json"], "does not exist"),
    (["--config_overrides", "hidden_sizee=64"], "Unknown TnnConfig field"),
    (["--config_overrides", "hidden_size"], "key=value"),
    (["--config_overrides", "token_mixer=nope"], "token_mixer must be one of"),
    (["--checkpointing_steps", "often"], "--checkpointing_steps"),
    (["--resume_from_checkpoint", "latest"], "no valid checkpoint"),
    (["--eval_lengths", "64,x"], "--eval_lengths"),
])
def test_bad_flags_fail_before_training(tmp_path, flags, message):
    argv = TINY + ["--output_dir", str(tmp_path / "out")] + flags
    with pytest.raises(ValueError, match=message):
        lm_setup.setup(lm_arguments.parse_args("clm", argv), "clm")
    assert not (tmp_path / "out" / "model.safetensors").exists()


def test_block_size_larger_than_data(tmp_path, text_files, capsys):
    train, valid = text_files
    argv = TINY + ["--train_file", str(train), "--validation_file", str(valid), "--block_size", "1000000",
                   "--output_dir", str(tmp_path)]
    with pytest.raises(SystemExit) as exit_info:  # the CLI entry point: status 2 and one clear line
        lm_training.cli_main("clm", argv)
    assert exit_info.value.code == 2
    assert "--block_size 1000000 is larger than the train data" in capsys.readouterr().err
    assert not (tmp_path / "metrics.jsonl").exists()


def test_config_overrides_parse_json_values():
    parsed = lm_arguments.parse_config_overrides("a=1, b=0.5,c=fd,d=null,e=true")
    assert parsed == {"a": 1, "b": 0.5, "c": "fd", "d": None, "e": True}


def test_sliding_windows_score_every_target_once():
    for length, window in [(64, 16), (50, 16), (16, 16), (33, 8)]:
        scored = []
        for start, end, first in lm_evaluation._windows(length, window):
            assert end - start <= window
            scored += range(max(first, start + 1), end)  # targets this window scores (the shift drops `start`)
        assert sorted(scored) == list(range(1, length))


def test_accelerate_cpu_launch_detection():
    env = {"ACCELERATE_USE_CPU": "True", "MASTER_PORT": "29500"}
    argv = ["python", "accelerate", "launch", "--cpu", "--num_processes", "2", sys.argv[0], "--num_processes", "9"]
    assert cpu_launch.dropped_process_count(env, argv) == 2
    assert cpu_launch.dropped_process_count({**env, "WORLD_SIZE": "2"}, argv) is None  # already distributed
    assert cpu_launch.dropped_process_count({"ACCELERATE_USE_CPU": "True"}, argv) is None  # N = 1: no MASTER_PORT


def test_push_to_hub_publishes_through_the_publishing_code(tmp_path, monkeypatch):
    monkeypatch.setattr(hub_folder, "_current_token", lambda: None)
    argv = TINY + ["--output_dir", str(tmp_path / "run"), "--max_train_steps", "2", "--push_to_hub",
                   "--hub_model_id", "me/tnn-tiny", "--checkpointing_steps", "1"]
    with pytest.raises(ValueError, match="--push_to_hub: no Hugging Face token"):  # before training
        lm_setup.setup(lm_arguments.parse_args("clm", argv), "clm")
    with pytest.raises(ValueError, match="--hub_model_id 'not a repo'"):
        lm_setup.setup(lm_arguments.parse_args("clm", argv + ["--hub_model_id", "not a repo"]), "clm")

    uploads = []

    def fake_upload(folder, repo_id, **kwargs):
        uploads.append((repo_id, sorted(p.name for p in Path(folder).iterdir()), kwargs["commit_message"]))
        return "https://hub/commit/1"

    monkeypatch.setattr(hub_folder, "_current_token", lambda: "a-token")
    monkeypatch.setattr(hub_upload, "upload_folder", fake_upload)
    run("clm", argv)
    repo_id, files, message = uploads[0]
    assert repo_id == "me/tnn-tiny" and message == "train_clm: step 2"
    assert {"README.md", "config.json", "model.safetensors", "tokenizer.json"} <= set(files)
    assert not any(name.startswith(("step_", "optimizer", "metrics")) for name in files)


# ----------------------------------------------------------------------------------------------------------------
# Short runs
# ----------------------------------------------------------------------------------------------------------------
def test_train_clm_on_local_text_file(tmp_path, text_files):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    train, valid = text_files
    out = tmp_path / "clm"
    outcome = run("clm", TINY + ["--train_file", str(train), "--validation_file", str(valid), "--output_dir", str(out),
                                 "--max_train_steps", "12", "--learning_rate", "1e-2",
                                 "--per_device_train_batch_size", "8", "--logging_steps", "4",
                                 "--eval_lengths", "16,32,64", "--sample_prompt", "The",
                                 "--sample_max_new_tokens", "5"])
    results = json.loads((out / "all_results.json").read_text())
    assert results["train_steps"] == 12
    assert math.isclose(results["perplexity"], math.exp(results["eval_loss"]), rel_tol=1e-9)
    vocab = len(outcome.tokenizer)
    assert results["eval_loss"] < math.log(vocab)  # learned something beyond the uniform guess
    assert set(results["eval_lengths"]) == {"16", "32", "64"} and (out / "eval_lengths.png").stat().st_size > 0
    lines = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [x["step"] for x in lines if "train_loss" in x] == [4, 8, 12]
    assert outcome.samples and outcome.samples[0].startswith("The")

    model = AutoModelForCausalLM.from_pretrained(out, trust_remote_code=True)
    tokenizer = AutoTokenizer.from_pretrained(out)
    assert len(tokenizer) == vocab
    ids = tokenizer("def f(x): return x", return_tensors="pt").input_ids
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, outcome.model.eval()(ids).logits)

    # --model_name_or_path continues from the saved folder (its tokenizer too)
    more = run("clm", ["--model_name_or_path", str(out), "--train_file", str(train), "--validation_file", str(valid),
                       "--block_size", "16", "--report_to", "none", "--max_train_steps", "2",
                       "--output_dir", str(tmp_path / "more")])
    assert len(more.tokenizer) == vocab and more.results["train_steps"] == 2


def test_other_architectures_through_config_json(tmp_path, text_files):
    """A JSON config of another model type (the quality benchmark's GPT-2) trains through the same path; its length
    evaluation falls back to a sliding window of its position table."""
    train, valid = text_files
    config = tmp_path / "gpt2.json"
    config.write_text(json.dumps({"model_type": "gpt2", "n_positions": 16, "n_embd": 16, "n_layer": 1, "n_head": 2}))
    outcome = run("clm", TINY[2:] + ["--config_name", str(config), "--config_overrides", "resid_pdrop=0.0",
                                     "--train_file", str(train), "--validation_file", str(valid),
                                     "--max_train_steps", "2", "--eval_lengths", "16,64",
                                     "--output_dir", str(tmp_path / "out")])
    assert type(outcome.model).__name__ == "GPT2LMHeadModel" and outcome.model.config.resid_pdrop == 0.0
    lengths = outcome.results["eval_lengths"]
    assert lengths["16"]["mode"] == "full" and lengths["64"]["mode"].startswith("sliding window 16")
    scored = lengths["64"]["tokens"] // 63 * 64  # the same text at both lengths: each segment scores all but 1 token
    assert lengths["64"]["tokens"] % 63 == 0 and lengths["16"]["tokens"] == scored // 16 * 15
    with pytest.raises(ValueError, match="unknown GPT2Config field"):
        lm_setup.setup(lm_arguments.parse_args("clm", ["--config_name", str(config), "--config_overrides", "n_embdd=3",
                                       "--output_dir", str(tmp_path / "bad")]), "clm")


def test_train_mlm_on_embedded_corpus(tmp_path):
    from transformers import AutoModelForMaskedLM

    out = tmp_path / "mlm"
    outcome = run("mlm", TINY + ["--output_dir", str(out), "--max_train_steps", "4",
                                 "--per_device_train_batch_size", "4", "--mlm_probability", "0.3"])
    results = json.loads((out / "all_results.json").read_text())
    assert math.isfinite(results["eval_loss"]) and results["perplexity"] > 1
    model = AutoModelForMaskedLM.from_pretrained(out, trust_remote_code=True)
    assert model.config.causal is False and type(model).__name__ == "TnnForMaskedLM"
    assert outcome.tokenizer.mask_token == "<mask>"


# ----------------------------------------------------------------------------------------------------------------
# Exact resume and atomic checkpoints
# ----------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("task", ["clm", "mlm"])
def test_resume_matches_an_uninterrupted_run(tmp_path, text_files, task):
    train, valid = text_files
    # Dropout and MLM masking exercise the RNG, accumulation + a warm-up schedule the scheduler, 8 steps over a small
    # train split cross an epoch boundary, so the data position matters.
    argv = TINY + ["--train_file", str(train), "--validation_file", str(valid), "--config_overrides", "dropout=0.1",
                   "--per_device_train_batch_size", "32", "--gradient_accumulation_steps", "2",
                   "--max_train_steps", "8", "--num_warmup_steps", "2", "--checkpointing_steps", "5",
                   "--learning_rate", "1e-2"]
    run(task, argv + ["--output_dir", str(tmp_path / "straight")])
    state = json.loads((tmp_path / "straight" / "step_5" / checkpoints.TRAINER_STATE).read_text())
    assert state["completed_steps"] == 5 and state["epoch"] >= 1  # resumed after an epoch boundary ...
    assert 5 % state["steps_per_epoch"] != 0  # ... and mid-epoch
    shutil.copytree(tmp_path / "straight" / "step_5", tmp_path / "resumed" / "step_5")  # the run that "stopped" at 5
    run(task, argv + ["--output_dir", str(tmp_path / "resumed"), "--resume_from_checkpoint", "latest"])
    assert_same_weights(tmp_path / "straight", tmp_path / "resumed")
    before, after = weights(tmp_path / "straight" / "step_5"), weights(tmp_path / "straight")
    assert any(not torch.equal(before[k], after[k]) for k in before)  # the last 3 steps did change the weights


def test_crash_mid_checkpoint_leaves_no_valid_checkpoint(tmp_path, text_files, monkeypatch):
    from accelerate import Accelerator

    train, valid = text_files
    argv = TINY + ["--train_file", str(train), "--validation_file", str(valid), "--max_train_steps", "3",
                   "--checkpointing_steps", "2", "--per_device_train_batch_size", "4", "--output_dir", str(tmp_path)]
    original = Accelerator.save_state

    def save_then_crash(self, output_dir, *args, **kwargs):
        original(self, output_dir, *args, **kwargs)  # model, optimizer, RNG files are on disk ...
        raise RuntimeError("simulated crash")  # ... then the process dies before the checkpoint is complete

    monkeypatch.setattr(Accelerator, "save_state", save_then_crash)
    with pytest.raises(RuntimeError, match="simulated crash"):
        run("clm", argv)
    partial = tmp_path / f"{checkpoints.TMP_PREFIX}step_2"
    assert (partial / "model.safetensors").is_file()  # the crash did happen mid-write
    assert not (tmp_path / "step_2").exists()
    assert checkpoints.find_latest_checkpoint(tmp_path) is None
    with pytest.raises(ValueError, match="no valid checkpoint"):
        checkpoints.resolve_checkpoint("latest", str(tmp_path))
    with pytest.raises(ValueError, match="not a complete checkpoint"):
        checkpoints.resolve_checkpoint(str(partial), str(tmp_path))

    monkeypatch.setattr(Accelerator, "save_state", original)
    run("clm", argv + ["--overwrite_output_dir"])  # a new run there replaces the leftover, completes the checkpoint
    assert checkpoints.is_valid_checkpoint(tmp_path / "step_2") and not partial.exists()


def test_progress_lines_are_logged_at_info(tmp_path, caplog):
    """setup() sets the recipes' parent logger to INFO on the main process: the setup summary and the loop's
    checkpoint lines, logged by different modules, both reach the user."""
    import logging

    caplog.handler.setLevel(logging.INFO)  # capture INFO; the loggers' own levels stay as setup() leaves them
    run("clm", TINY + ["--max_train_steps", "2", "--checkpointing_steps", "2", "--output_dir", str(tmp_path)])
    messages = {record.name: record.getMessage() for record in caplog.records if record.levelno == logging.INFO}
    assert "parameters" in messages["modeling_tnn.recipes.pretraining.setup"]
    assert messages["modeling_tnn.recipes.pretraining.loop"].startswith("Saved checkpoint")
