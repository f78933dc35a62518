"""The pretraining scripts never mix or lose work: a used --output_dir is refused, a resume checks that the checkpoint
belongs to the run, SIGINT/SIGTERM write a checkpoint and say how to resume, old checkpoints rotate, bad data names
the file and column, and the saved tokenizers load with plain ``AutoTokenizer`` where ``modeling_tnn`` is blocked."""

from __future__ import annotations

import json
import logging
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from modeling_tnn.recipes.pretraining import arguments as lm_arguments
from modeling_tnn.recipes.pretraining import checkpoints
from modeling_tnn.recipes.pretraining import data as lm_data
from modeling_tnn.recipes.pretraining import evaluation as lm_evaluation
from modeling_tnn.recipes.pretraining import generation as lm_generation
from modeling_tnn.recipes.pretraining import setup as lm_setup
from modeling_tnn.recipes.pretraining import stop_signals
from modeling_tnn.recipes.pretraining import tracking
from modeling_tnn.recipes.pretraining import training as lm_training

from tests.remote_code import run_with_package_blocked
from tests.support import SCRIPTS, TINY_PRETRAINING, run_pretraining, wait_for_logged_steps, write_text_pair

TINY = TINY_PRETRAINING + ["--max_eval_samples", "4", "--per_device_train_batch_size", "4"]


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> list[str]:
    """--train_file/--validation_file flags of a small local text pair (a few dozen 16-token blocks)."""
    train, valid = write_text_pair(tmp_path_factory.mktemp("text"), 3000, 1500)
    return ["--train_file", str(train), "--validation_file", str(valid)]


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory, data) -> Path:
    """A finished 2-step run with checkpoints step_1 and step_2 (dense, batch 4)."""
    out = tmp_path_factory.mktemp("runs") / "dense"
    run_pretraining("clm", TINY + data + ["--output_dir", str(out), "--max_train_steps", "2",
                                          "--checkpointing_steps", "1"])
    return out


def setup(argv: list[str], task: str = "clm"):
    return lm_setup.setup(lm_arguments.parse_args(task, argv), task)


def cli_error(argv: list[str], capsys, task: str = "clm") -> str:
    """Run the CLI entry point, expect exit status 2 and one ``error:`` line (no traceback), and return it."""
    with pytest.raises(SystemExit) as exit_info:
        lm_training.cli_main(task, argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if "error:" in line]
    assert len(lines) == 1, err
    return lines[0]


# ----------------------------------------------------------------------------------------------------------------
# A used --output_dir, and checkpoints of another run
# ----------------------------------------------------------------------------------------------------------------
def test_output_dir_holding_a_run_is_refused_unless_overwritten(tmp_path, finished_run, data, capsys):
    import shutil

    out = tmp_path / "used"
    shutil.copytree(finished_run, out)
    line = cli_error(TINY + data + ["--output_dir", str(out), "--max_train_steps", "1"], capsys)
    assert f"--output_dir {str(out)!r} already holds a run (step_1, step_2, " in line
    assert "--resume_from_checkpoint latest" in line and "--overwrite_output_dir" in line
    with pytest.raises(ValueError, match="cannot be combined with --resume_from_checkpoint"):
        setup(TINY + data + ["--output_dir", str(out), "--overwrite_output_dir", "--resume_from_checkpoint", "latest"])

    # --overwrite_output_dir: the old run's checkpoints and results go, so `latest` can only find the new run's
    run_pretraining("clm", TINY + data + ["--output_dir", str(out), "--max_train_steps", "1",
                                          "--overwrite_output_dir"])
    assert not (out / "step_1").exists() and not (out / "step_2").exists()
    assert json.loads((out / checkpoints.RESULTS_FILE).read_text())["train_steps"] == 1
    assert [json.loads(x)["step"] for x in (out / checkpoints.METRICS_FILE).read_text().splitlines()] == [1, 1]

    # an empty folder, or one holding unrelated files, is fine
    (tmp_path / "fresh").mkdir()
    (tmp_path / "fresh" / "notes.md").write_text("mine")
    assert checkpoints.run_files_in(tmp_path / "fresh") == []


def test_resume_refuses_a_checkpoint_of_another_run_naming_every_field(tmp_path, finished_run, data, capsys):
    from modeling_tnn.recipes.pretraining.tokenizer import train_byte_level_bpe

    step = finished_run / "step_1"
    # another token mixer and width, another batch size: the FD run resuming the dense run's checkpoint
    line = cli_error(TINY + data + ["--output_dir", str(tmp_path / "fd"), "--resume_from_checkpoint", str(step),
                                    "--config_overrides", "token_mixer=fd,hidden_size=16",
                                    "--per_device_train_batch_size", "2"], capsys)
    assert f": error: --resume_from_checkpoint {str(step)!r} was written by another run (checkpoint -> this " in line
    for fragment in ("hidden_size 32 -> 16", "token_mixer 'dense' -> 'fd'", "per_device_train_batch_size 4 -> 2"):
        assert fragment in line
    assert "block_size" not in line and "vocab_size" not in line  # only what differs

    # another tokenizer (and therefore vocabulary size), another block size
    other = tmp_path / "other_tokenizer"
    train_byte_level_bpe(["some completely different text for a tokenizer"] * 20, vocab_size=280).save_pretrained(
        other)
    line = cli_error(TINY + data + ["--output_dir", str(tmp_path / "tok"), "--resume_from_checkpoint", str(step),
                                    "--tokenizer_name", str(other), "--block_size", "8"], capsys)
    for fragment in ("vocab_size 300 -> 2", "tokenizer size 300 -> 2", "tokenizer vocabulary sha256 ",
                     "block_size 16 -> 8", "train_blocks "):
        assert fragment in line

    # the same flags resume (the tokenizer comes from the checkpoint)
    outcome = run_pretraining("clm", TINY + data + ["--output_dir", str(tmp_path / "same"),
                                                    "--resume_from_checkpoint", str(step), "--max_train_steps", "2"])
    assert outcome.results["train_steps"] == 2


def test_checkpoint_records_the_model_config_and_tokenizer(finished_run):
    state = json.loads((finished_run / "step_2" / checkpoints.TRAINER_STATE).read_text())
    assert state["model_config"]["token_mixer"] == "dense" and state["model_config"]["hidden_size"] == 32
    assert "transformers_version" not in state["model_config"]
    assert state["tokenizer"]["size"] == 300 and len(state["tokenizer"]["sha256"]) == 64
    assert state["geometry"]["block_size"] == 16


# ----------------------------------------------------------------------------------------------------------------
# Signals, rotation, the tied-weight warning
# ----------------------------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_sigint_writes_a_checkpoint_and_the_run_resumes_from_it(tmp_path, data):
    out = tmp_path / "run"
    command = [sys.executable, str(SCRIPTS / "train_clm.py"), *TINY, *data, "--output_dir", str(out),
               "--max_train_steps", "100000", "--logging_steps", "1"]
    env = dict(os.environ, OMP_NUM_THREADS="1", TQDM_DISABLE="1")
    with open(tmp_path / "stdout", "w") as stdout, open(tmp_path / "stderr", "w") as stderr:
        process = subprocess.Popen(command, cwd=tmp_path, env=env, stdout=stdout, stderr=stderr)
        try:
            wait_for_logged_steps(process, out / checkpoints.METRICS_FILE, steps=2, timeout=120)
            assert process.poll() is None, (tmp_path / "stderr").read_text()[-2000:]
            process.send_signal(signal.SIGINT)
            code = process.wait(timeout=60)
        finally:
            if process.poll() is None:
                process.kill()
    err = (tmp_path / "stderr").read_text()
    assert code == 130, err[-2000:]
    assert "Traceback" not in err and "KeyboardInterrupt" not in err
    assert "Removed shared tensor" not in err  # accelerate's warning at every save of tied weights
    last = err.strip().splitlines()[-1]
    match = re.fullmatch(r"train_clm\.py: stopped by SIGINT at step (\d+); saved checkpoint (\S+); "
                         r"resume with --resume_from_checkpoint (\S+)", last)
    assert match, last
    step, checkpoint = int(match[1]), Path(match[2])
    assert match[3] == match[2] and checkpoint == out / f"step_{step}" and step >= 2
    assert checkpoints.is_valid_checkpoint(checkpoint)
    assert json.loads((checkpoint / checkpoints.TRAINER_STATE).read_text())["completed_steps"] == step

    # resuming (with the flag the message gave) continues from that step
    outcome = run_pretraining("clm", TINY + data + ["--output_dir", str(out), "--resume_from_checkpoint",
                                                    str(checkpoint), "--max_train_steps", str(step + 2),
                                                    "--logging_steps", "1"])
    assert outcome.results["train_steps"] == step + 2
    logged = [json.loads(x)["step"] for x in (out / checkpoints.METRICS_FILE).read_text().splitlines()
              if "train_loss" in json.loads(x)]
    assert logged[-2:] == [step + 1, step + 2] and logged.count(step + 1) == 1


@pytest.mark.slow
def test_sigterm_checkpoints_the_current_step(tmp_path, data, monkeypatch):
    calls = {"n": 0}
    original = lm_evaluation.InputBuilder.__call__

    def signal_at_third_batch(self, batch):
        calls["n"] += 1
        if calls["n"] == 3:
            os.kill(os.getpid(), signal.SIGTERM)  # handled between two bytecodes: during step 3
        return original(self, batch)

    monkeypatch.setattr(lm_evaluation.InputBuilder, "__call__", signal_at_third_batch)
    previous = signal.getsignal(signal.SIGTERM)
    out = tmp_path / "run"
    argv = TINY + data + ["--output_dir", str(out), "--max_train_steps", "50", "--checkpointing_steps", "20"]
    with pytest.raises(stop_signals.TrainingInterrupted) as stop:
        run_pretraining("clm", argv)
    assert signal.getsignal(signal.SIGTERM) is previous  # the handler is restored
    assert (stop.value.signal_name, stop.value.step, stop.value.exit_code) == ("SIGTERM", 3, 143)
    assert stop.value.checkpoint == out / "step_3" and checkpoints.is_valid_checkpoint(out / "step_3")
    assert not (out / "model.safetensors").exists()  # stopped: no final save

    # a checkpoint of the last step resumes straight to the final save (no extra step)
    monkeypatch.setattr(lm_evaluation.InputBuilder, "__call__", original)
    outcome = run_pretraining("clm", TINY + data + ["--output_dir", str(out), "--resume_from_checkpoint", "latest",
                                                    "--max_train_steps", "3", "--checkpointing_steps", "20"])
    assert outcome.results["train_steps"] == 3 and (out / "model.safetensors").is_file()



class _Processes:
    """What StopOnSignal.requested uses of an Accelerator: ``reduce`` max-combines this process's tensor with what
    the other processes sent, as the collective does (and records what this process sent)."""

    def __init__(self, *others: torch.Tensor):
        self.num_processes, self.device, self.others, self.sent = 1 + len(others), torch.device("cpu"), others, []

    def reduce(self, tensor, reduction):
        assert reduction == "max"
        self.sent.append(tensor)
        return torch.stack([tensor, *self.others]).amax(0)


def _stopper(signal_name):
    stopper = stop_signals.StopOnSignal()
    stopper.signal_name = signal_name  # as its handler sets it
    return stopper


def test_every_process_agrees_on_the_signal_that_stops_them():
    """A signal that reached one process stops all of them with its name (so each exits with 130 or 143)."""
    for here, elsewhere, agreed in [(None, None, None), (None, "SIGTERM", "SIGTERM"), ("SIGINT", None, "SIGINT"),
                                    (None, "SIGINT", "SIGINT"), ("SIGINT", "SIGTERM", "SIGTERM")]:
        other = _Processes(torch.zeros(1, dtype=torch.long))
        _stopper(elsewhere).requested(other)
        assert _stopper(here).requested(_Processes(*other.sent)) == agreed, (here, elsewhere)

def test_checkpoints_total_limit_keeps_the_newest(tmp_path, data, caplog):
    out = tmp_path / "run"
    with caplog.at_level(logging.WARNING):
        run_pretraining("clm", TINY + data + ["--output_dir", str(out), "--max_train_steps", "5",
                                              "--checkpointing_steps", "1", "--checkpoints_total_limit", "2"])
    assert sorted(p.name for p in out.iterdir() if p.is_dir()) == ["step_4", "step_5"]  # no .tmp- leftovers
    assert checkpoints.find_latest_checkpoint(out) == out / "step_5"
    assert "Removed shared tensor" not in caplog.text
    with pytest.raises(ValueError, match="--checkpoints_total_limit must be a positive integer"):
        setup(TINY + ["--output_dir", str(tmp_path / "x"), "--checkpoints_total_limit", "0"])


def test_tied_weight_filter_only_drops_the_tied_weight_message():
    def record(message: str) -> logging.LogRecord:
        return logging.LogRecord("accelerate.utils.other", logging.WARNING, __file__, 1, message, None, None)

    tracking.TIED_WEIGHT_FILTER.names.add("lm_head.weight")
    tied = "[RANK 0] Removed shared tensor {'lm_head.weight'} while saving. This should be OK"
    assert not tracking.TIED_WEIGHT_FILTER.filter(record(tied))
    untied = "Removed shared tensor {'encoder.w', 'lm_head.weight'} while saving"
    assert tracking.TIED_WEIGHT_FILTER.filter(record(untied))
    assert tracking.TIED_WEIGHT_FILTER.filter(record("some other warning"))


# ----------------------------------------------------------------------------------------------------------------
# Data errors name the data
# ----------------------------------------------------------------------------------------------------------------
IDS_CSV = "id,body,label\n1,hello world and more,a\n2,more text here,b\n"


@pytest.mark.parametrize("files, flags, expected", [
    ({"empty.txt": ""}, ["--train_file", "empty.txt"], "--train_file 'empty.txt' is empty."),
    ({"ids.csv": IDS_CSV}, ["--train_file", "ids.csv", "--validation_file", "ids.csv"],
     "--train_file 'ids.csv': column 'id' (the first column, used as there is no 'text' column) holds int64 values, "
     "not text; columns: id (int64), body ("),
    ({"ids.csv": IDS_CSV}, ["--train_file", "ids.csv", "--validation_file", "ids.csv", "--text_column", "id"],
     "--train_file 'ids.csv': column 'id' (--text_column) holds int64 values, not text"),
    ({"ids.csv": IDS_CSV}, ["--train_file", "ids.csv", "--validation_file", "ids.csv", "--text_column", "nope"],
     "--train_file 'ids.csv': --text_column 'nope' is not a column; columns: id (int64)"),
    ({"ids.csv": IDS_CSV}, ["--train_file", "ids.csv"],
     "--train_file 'ids.csv' has 2 rows: too few to hold out --validation_split_percentage 5%"),
    ({"header.csv": "id,body\n"}, ["--train_file", "header.csv"], "--train_file 'header.csv': no data rows."),
    ({"blank.txt": "  \n\n", "valid.txt": "some validation text " * 20},
     ["--train_file", "blank.txt", "--validation_file", "valid.txt"],
     "tokens in --train_file 'blank.txt'): use a smaller --block_size or more data."),
    ({"outputs/keep": ""}, ["--model_name_or_path", "outputs/dmeo"],
     "--model_name_or_path 'outputs/dmeo': no such folder."),
    ({}, ["--model_name_or_path", "./runs/demo"], "--model_name_or_path './runs/demo': no such folder 'runs'."),
    ({}, ["--tokenizer_name", "./tok"], "--tokenizer_name './tok': no such folder."),
    ({}, ["--config_name", "./cfg/small.json"], "--config_name './cfg/small.json': no such folder 'cfg'."),
    ({"outputs/run/step_3/trainer_state.json": "{}"}, ["--model_name_or_path", "outputs/run/step_3"],
     "is a folder without config.json (not a saved model); it is a training checkpoint: resume it with "
     "--resume_from_checkpoint outputs/run/step_3."),
    ({"outputs/notes.txt": "x"}, ["--tokenizer_name", "outputs"],
     "--tokenizer_name 'outputs' is a folder without tokenizer files"),
])
def test_data_and_path_errors_are_one_line_naming_them(tmp_path, monkeypatch, capsys, files, flags, expected):
    monkeypatch.chdir(tmp_path)
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    config = [] if "--model_name_or_path" in flags or "--config_name" in flags else ["--config_name", "tiny"]
    argv = TINY[2:] + config + ["--output_dir", str(tmp_path / "out")] + flags
    line = cli_error(argv, capsys)
    assert expected in line, line


# ----------------------------------------------------------------------------------------------------------------
# Evaluation runs without a generation cache; the generation-time table
# ----------------------------------------------------------------------------------------------------------------
def test_evaluation_calls_the_model_without_a_cache(finished_run):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(finished_run)
    seen = []
    model.register_forward_pre_hook(lambda module, args, kwargs: seen.append(kwargs.get("use_cache")),
                                    with_kwargs=True)
    stream = torch.randint(0, 300, (64,))
    lm_evaluation.evaluate_lengths(model, stream, [16, 32], batch_size=4)
    lm_evaluation.evaluate_lengths(model, stream, [32], window=16, batch_size=4)
    tokenizer = lm_data.AutoTokenizer.from_pretrained(finished_run)
    inputs = lm_evaluation.InputBuilder("clm", tokenizer, None)({"input_ids": stream[:32].view(2, 16)})
    model(**inputs)
    assert seen and all(value is False for value in seen)


def test_time_generation_reports_cached_and_full_recompute(finished_run):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(finished_run).train()
    rows = lm_generation.time_generation(model, [8, 40], new_tokens=2)
    assert [r["context"] for r in rows] == [8, 40]
    assert all(r["cached_ms"] > 0 and r["no_cache_ms"] > 0 for r in rows)
    assert model.training  # the mode is restored
    table = lm_generation.format_generation_table(rows)
    assert table.splitlines()[0].startswith("| context | ms/token with cache |") and "| 40 |" in table


# ----------------------------------------------------------------------------------------------------------------
# Saved tokenizers load with plain AutoTokenizer where modeling_tnn is blocked
# ----------------------------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_saved_tokenizers_load_without_the_package_and_without_a_prompt(tmp_path, finished_run):
    from modeling_tnn.recipes.pretraining.tokenizer import train_byte_level_bpe

    alone = tmp_path / "tokenizer"  # what tokenizer_training, glue_recipe and bench_quality write
    own = train_byte_level_bpe(["a tokenizer folder on its own"] * 20, vocab_size=270)
    own.save_pretrained(alone)
    expected = lm_data.AutoTokenizer.from_pretrained(finished_run)("def f(x): return x").input_ids
    done = run_with_package_blocked(f"""
        import json, warnings
        warnings.simplefilter("always")
        from transformers import AutoTokenizer, PreTrainedTokenizerFast
        out = {{}}
        out["alone"] = len(AutoTokenizer.from_pretrained({str(alone)!r}))
        checkpoint = {str(finished_run / "step_2")!r}
        out["checkpoint"] = AutoTokenizer.from_pretrained(checkpoint)("def f(x): return x").input_ids
        run = {str(finished_run)!r}
        out["run_fast"] = PreTrainedTokenizerFast.from_pretrained(run)("def f(x): return x").input_ids
        out["run_remote"] = AutoTokenizer.from_pretrained(run, trust_remote_code=True)("def f(x): return x").input_ids
        print("RESULT " + json.dumps(out))
    """, tmp_path)
    result = json.loads(done.stdout.split("RESULT ", 1)[1])
    assert result["alone"] == len(own)
    assert result["checkpoint"] == result["run_fast"] == result["run_remote"] == expected
    chatter = done.stdout.split("RESULT ", 1)[0] + done.stderr
    assert "custom code" not in chatter and "model of type" not in chatter, chatter
