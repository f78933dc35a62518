"""The GLUE comparison recipe (run_scripts/glue_recipe.py, modeling_tnn.recipes.glue.comparison) without its hour of
training: both models pretrained by the same train_mlm.py command but for the config, the suite over both with one
set of finetuning arguments, the summary files; and a failed process named with its log."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from modeling_tnn.recipes.glue import comparison
from modeling_tnn.recipes.glue.suite import run_one

from tests.support import PROJECT_ROOT, script_main


def flag(command: list[str], name: str) -> str:
    return command[command.index(name) + 1]


def test_both_models_pretrain_alike_then_the_suite_runs_over_both(tmp_path, monkeypatch):
    runs, suites = {}, []  # the two pretraining runs (at once, with --jobs 2) by their folder's name

    def fake_run_one(command, log_path, env=None, cwd=None):
        """What train_mlm.py leaves behind: all_results.json in its --output_dir (relative to cwd)."""
        out = Path(cwd) / flag(command, "--output_dir")
        runs[out.name] = (command, log_path, env, cwd)
        rank = 1 if out.name == "mlm_tnn" else 2
        (out / "all_results.json").write_text(json.dumps({"num_parameters": 1000 * rank, "train_steps": 10,
                                                          "perplexity": 100.0 + rank}))
        return 2.0

    def fake_suite(argv):
        suites.append(argv)
        Path(flag(argv, "--results_dir")).mkdir(parents=True)

    monkeypatch.setattr(comparison, "run_one", fake_run_one)
    monkeypatch.setattr(comparison, "run_suite", fake_suite)
    monkeypatch.setattr(comparison, "train_tokenizer", lambda text_file, vocab_size, folder: folder.mkdir())
    work, results = tmp_path / "work", tmp_path / "results"
    argv = ["--text", "embedded", "--work_dir", str(work), "--results_dir", str(results), "--tasks", "rte",
            "--pretrain_steps", "10", "--threads", "3", "--skip_existing"]
    script_main("glue_recipe")(argv)

    assert set(runs) == {"mlm_tnn", "mlm_bert"} and {cwd for *_, cwd in runs.values()} == {PROJECT_ROOT}
    assert all(env["OMP_NUM_THREADS"] == "3" for _, _, env, _ in runs.values())
    (tnn, tnn_log, *_), (bert, bert_log, *_) = runs["mlm_tnn"], runs["mlm_bert"]
    assert Path(tnn[1]) == PROJECT_ROOT / "run_scripts" / "train_mlm.py"
    assert flag(tnn, "--config_name") == "small" and json.loads(
        (PROJECT_ROOT / flag(bert, "--config_name")).read_text()) == comparison.BERT_CONFIG
    differing = {i for i, (a, b) in enumerate(zip(tnn, bert)) if a != b}
    assert len(tnn) == len(bert) and {tnn[i - 1] for i in differing} == {"--config_name", "--output_dir"}
    assert flag(tnn, "--max_train_steps") == "10" and flag(tnn, "--num_warmup_steps") == "1"
    assert (tnn_log, bert_log) == (work / "mlm_tnn.log", work / "mlm_bert.log")
    assert (work / "pretraining_text.txt").stat().st_size > 0

    [suite] = suites
    models = [suite[i + 1] for i, arg in enumerate(suite) if arg == "--model"]
    assert [m.split("=")[0] for m in models] == ["tnn", "bert"]
    assert [(PROJECT_ROOT / m.split("=")[1]).resolve() for m in models] == [work / "mlm_tnn", work / "mlm_bert"]
    before, after = suite[: suite.index("--")], suite[suite.index("--") + 1:]
    assert flag(before, "--tasks") == "rte" and "--skip_existing" in before and flag(before, "--threads") == "3"
    assert flag(after, "--max_train_samples") == "2000" and flag(after, "--learning_rate") == "0.0005"

    summary = json.loads((results / "pretraining.json").read_text())
    assert summary["recipe_command"] == "python run_scripts/glue_recipe.py " + " ".join(argv)
    assert summary["suite_command"].startswith("python run_scripts/run_glue_suite.py --model tnn=")
    assert summary["pretraining"]["bert"]["command"].startswith("python run_scripts/train_mlm.py --train_file ")
    assert [summary["pretraining"][m]["perplexity"] for m in ("tnn", "bert")] == [101.0, 102.0]
    table = (results / "pretraining.md").read_text()
    assert "| tnn | 1,000 | 10 x 2,048 | 101.0 | 2 s |" in table and "| bert | 2,000 |" in table


def test_a_missing_wikitext_is_one_error_naming_the_way_out(tmp_path, monkeypatch):
    monkeypatch.setenv("TNN_DATA_DIR", str(tmp_path))
    with pytest.raises(FileNotFoundError, match="--text embedded"):
        comparison.write_pretraining_text("wikitext2", tmp_path / "work")


@pytest.mark.parametrize("command, program", [
    ([sys.executable, "-m", "json.tool", "no_such_file.json"], "json.tool"),
    ([sys.executable, "SCRIPT"], "failing.py"),
], ids=["module", "script"])
def test_a_failed_process_is_named_with_its_log(tmp_path, command, program):
    script = tmp_path / "failing.py"
    script.write_text("print('the reason')\nraise SystemExit(3)\n")
    command = [str(script) if part == "SCRIPT" else part for part in command]
    with pytest.raises(RuntimeError, match=rf"^{program} failed \(exit [23]\); log .*run\.log") as error:
        run_one(command, tmp_path / "logs" / "run.log", cwd=tmp_path)
    assert program != "failing.py" or "the reason" in str(error.value)
