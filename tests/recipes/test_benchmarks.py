"""The benchmark harness and what it measures with: interleaved rounds and medians (on a fake clock), the record of
the commit and machine, the three files of a benchmark's folder, the scoped convolution policies and the compact
fit's reset, the reference models and parameter matching against the counts the published results were measured at,
the make-bench plan, and the A/B of two commits."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from modeling_tnn import TnnForCausalLM
from modeling_tnn.mixer_base import TokenMixer
from modeling_tnn.ops_dispatch import ConvolutionKernel, current_policy, plan_convolution
from modeling_tnn.ops_dispatch import Path as DispatchPath
from modeling_tnn.recipes.benchmarks import compact_fit, harness, plan, policies
from modeling_tnn.recipes.benchmarks import generation as bench_generation
from modeling_tnn.recipes.benchmarks import training as bench_training
from modeling_tnn.recipes.benchmarks.reference_models import (
    MinimalGpt,
    baseline_model,
    closest_size,
    count_parameters,
    matched_mlp_width,
)

from tests.support import AT_SESSION_START, PROJECT_ROOT, Started, tiny_config


class FakeClock:
    """A clock that moves only when a workload says so."""

    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def recorder(clock: FakeClock, log: list, name: str, durations: list[float]):
    """A workload phase that logs its name and advances the clock by the next of ``durations``."""
    def run():
        log.append(name)
        clock.now += durations[len([n for n in log if n == name]) - 1]
    return run


def test_rounds_interleave_after_a_warm_up_and_report_medians():
    clock, log = FakeClock(), []
    work = {"a": harness.workload(recorder(clock, log, "a", [9.0, 1.0, 5.0, 3.0])),
            "b": harness.workload(recorder(clock, log, "b1", [9.0, 2.0, 2.0, 8.0]),
                                  recorder(clock, log, "b2", [9.0, 1.0, 1.0, 1.0]), names=("fwd", "opt"),
                                  before=recorder(clock, log, "before", [100.0] * 4))}
    timings = harness.interleaved(work, rounds=3, warmup=1, clock=clock)
    assert log == ["a", "before", "b1", "b2"] * 4  # the warm-up round, then three interleaved ones
    assert timings["a"].samples == [1.0, 5.0, 3.0] and timings["a"].median == 3.0
    assert timings["b"].samples == [3.0, 3.0, 9.0] and timings["b"].median == 3.0  # ``before`` is not timed
    assert timings["b"].phases == {"fwd": [2.0, 2.0, 8.0], "opt": [1.0, 1.0, 1.0]}
    summary = timings["a"].summary()
    assert (summary["q1_s"], summary["q3_s"], summary["min_s"], summary["max_s"]) == (2.0, 4.0, 1.0, 5.0)
    assert summary["spread"] == pytest.approx(2.0 / 3.0)
    assert timings["b"].summary()["fwd_median_s"] == 2.0


def test_rotation_shifts_the_order_each_round_and_bad_counts_are_refused():
    clock, log = FakeClock(), []
    work = {name: harness.workload(recorder(clock, log, name, [1.0] * 9)) for name in "abc"}
    harness.interleaved(work, rounds=3, warmup=0, clock=clock, rotate=True)
    assert "".join(log) == "abcbcacab"
    with pytest.raises(ValueError, match="rounds must be at least 1"):
        harness.interleaved(work, rounds=0)
    with pytest.raises(ValueError, match="Workload.phases"):
        harness.workload()


def test_self_timed_samples_and_the_streamer_clock():
    values = iter([4.0, 1.0, 6.0, 2.0, 8.0, 3.0])
    timings = harness.interleaved_samples({"x": lambda: next(values), "y": lambda: next(values)}, rounds=2,
                                          warmup=1)
    assert timings["x"].samples == [6.0, 8.0] and timings["y"].samples == [2.0, 3.0]
    clock = FakeClock()
    streamer = harness.StreamerClock(clock)
    for t in (0.0, 5.0, 6.0, 8.0, 9.0):  # the prompt, the first token after the prefill, then three more
        clock.now = t
        streamer.put(None)
    assert streamer.token_seconds() == pytest.approx(4 / 3)  # every interval after the first token, the slow one too


def test_source_state_names_the_commit_and_whether_the_tree_is_dirty(tmp_path):
    state = harness.source_state()
    head = subprocess.run(["git", "-C", str(PROJECT_ROOT), "rev-parse", "HEAD"], capture_output=True, text=True)
    if head.returncode:
        pytest.skip("not a git checkout")
    assert state["commit"] == head.stdout.strip() and isinstance(state["dirty"], bool)
    assert harness.source_state(tmp_path) == dict(commit=None, dirty=None)


def test_a_report_folder_holds_json_table_and_figure(tmp_path):
    timing = harness.Timing([0.002, 0.001, 0.003])
    folder = harness.write_report(tmp_path / "bench_x", "bench x", "python run_scripts/bench_x.py --rounds 3",
                                  dict(rounds=3), dict(rows=[1, 2]), "| a | b |\n|---|---|", timings={"tnn": timing},
                                  started=harness.CLOCK())
    record = json.loads((folder / "results.json").read_text())
    assert record["command"] == "python run_scripts/bench_x.py --rounds 3" and record["settings"] == {"rounds": 3}
    assert record["results"] == {"rows": [1, 2]} and record["source"] == harness.source_state()
    machine = record["machine"]
    assert machine["cores"] >= 1 and machine["torch_threads"] == torch.get_num_threads()
    assert machine["torch"] == torch.__version__ and machine["cpu"] and machine["transformers"]
    table = (folder / "table.md").read_text()
    assert table.startswith("# bench x\n") and "`python run_scripts/bench_x.py --rounds 3`" in table
    assert (record["source"]["commit"] or "no git commit")[:12] in table and table.rstrip().endswith("|---|---|")
    assert (folder / "figure.png").read_bytes()[:4] == b"\x89PNG"
    with pytest.raises(ValueError, match="plot callable or timings"):
        harness.write_report(tmp_path / "y", "y", "c", {}, {}, "")


def test_one_thread_by_default():
    before = torch.get_num_threads()
    try:
        assert harness.set_threads() == 1
    finally:
        torch.set_num_threads(before)
    with pytest.raises(ValueError, match="threads must be at least 1"):
        harness.set_threads(0)


# -- reference models and parameter matching -------------------------------------------------------------------------


def test_closest_size_bisects_to_the_nearest_count():
    assert closest_size(lambda size: torch.nn.Linear(size, 1), 1001) == 1000  # size weights + 1 bias
    assert closest_size(lambda size: torch.nn.Linear(size, 1), 1001, multiple=64) == 1024
    shared = torch.nn.Linear(4, 4)
    assert count_parameters(torch.nn.Sequential(shared, shared)) == 20  # a shared tensor once


def test_minimal_gpt_is_the_small_gpt_recipes_model():
    torch.manual_seed(0)
    model = MinimalGpt(vocab_size=65, block=64, width=128, layers=4, heads=4)
    assert count_parameters(model) == 804_096  # the count results/bench_training/small_gpt was measured at
    ids = torch.randint(0, 65, (2, 64))
    loss = model(input_ids=ids, labels=ids).loss
    assert loss.ndim == 0 and torch.isfinite(loss)
    loss.backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in model.parameters())
    assert model.head.weight is model.token_table.weight  # the output projection tied to the token table


@pytest.mark.parametrize("argv, expected", [
    (["--suite", "small_gpt"], {"causal/tnn-dense": 863_744, "causal/gpt2": 801_664, "causal/mingpt": 804_096}),
    (["--families", "causal", "--lengths", "2048"], {"causal/tnn-dense": 6_156_416, "causal/gpt2": 6_155_480,
                                                     "causal/llama": 6_155_520}),
    (["--suite", "lra", "--lengths", "4096"], {"classify/tnn-dense": 528_730, "classify/bert": 528_254}),
], ids=["small_gpt", "causal_width_256", "lra"])
def test_training_baselines_match_the_published_counts(argv, expected):
    args = bench_training.parse_args([*argv, "--memory_lengths", ""])
    counts = {f"{f}/{m}": total for (f, m), (total, _) in bench_training.parameter_counts(args).items()}
    assert {key: counts[key] for key in expected} == expected


def test_decoding_baselines_match_the_published_counts():
    sizes = dict(vocab_size=8192, hidden_size=256, layers=4, head_dim=64)
    target = 6_156_416  # TNN dense of the decoding benchmark
    for kind, positions, expected in (("gpt2", 8192 + 15 + 64, 6_155_480), ("llama", 1 << 17, 6_155_520)):
        width = matched_mlp_width(kind, "causal", target, positions=positions, **sizes)
        with torch.device("meta"):
            model = baseline_model(kind, "causal", mlp_width=width, positions=positions, **sizes)
        assert count_parameters(model, skip=("wpe",)) == expected


def test_gpt2s_position_table_covers_the_prefill_longer_than_every_context():
    """The decoding benchmark's prefill runs GPT-2 on ``--prefill_length`` tokens: a table sized for the contexts
    alone failed with an IndexError after minutes of timing."""
    args = bench_generation.parse_args(["--contexts", "32", "--prefill_length", "300", "--hidden_size", "64",
                                        "--num_layers", "1", "--vocab_size", "256", "--rounds", "1"])
    gpt2 = bench_generation.baselines(args, 100_000, [32])["gpt2"]
    assert gpt2.config.n_positions >= 300 + (args.rounds + 1) * (harness.DECODE_TOKENS + 1)


# -- the scoped convolution policies and the compact fit's reset -----------------------------------------------------


def test_policies_scope_the_dispatchers_policy_and_restore_it():
    default = current_policy()
    with policies.accelerator_like_policy():
        assert current_policy() == default.as_on_accelerator()
        block = torch.randn(12, 64, 384)  # the small-GPT step's width: several CPU chunks, one single block here
        assert current_policy().single_block(block, 128) and not default.single_block(block, 128)
    assert current_policy() == default
    x = torch.randn(1, 512, 8)  # one row of a long input: the FFT path by default
    kernel = ConvolutionKernel(taps=lambda reach: torch.randn(reach + 1, 8), causal=True)
    assert plan_convolution(x, kernel).path is not DispatchPath.DIRECT
    with policies.forced_convolution_path("direct"):
        assert plan_convolution(x, kernel).path is DispatchPath.DIRECT
    with policies.forced_convolution_path("fft"):
        assert plan_convolution(torch.randn(64, 8, 8), kernel).path is not DispatchPath.DIRECT
    assert current_policy() == default
    with pytest.raises(ValueError, match="path must be one of"):
        with policies.forced_convolution_path("ski"):
            pass


def test_no_benchmark_patches_the_model_code():
    """Paths are forced by scoping a policy: no benchmark module sets attributes of modeling_tnn's modules."""
    offenders = [path.name for path in (PROJECT_ROOT / "modeling_tnn" / "recipes" / "benchmarks").glob("*.py")
                 if re.search(r"\bsetattr\(|monkeypatch", path.read_text())]
    assert not offenders


def test_clear_fits_drops_the_memoised_modal_tail():
    torch.manual_seed(0)
    model = TnnForCausalLM(tiny_config("dense", causal=True)).eval()
    compact_fit.first_cached_forward(model)
    mixers = [m for m in model.modules() if isinstance(m, TokenMixer)]
    device = torch.device("cpu")
    assert mixers and all(m.decoding_plans.latest(1e-5, device) is not None for m in mixers)
    compact_fit.clear_fits(model)
    assert all(not m._eval_cache and m.decoding_plans.latest(1e-5, device) is None for m in mixers)
    assert not model.training


def test_compact_fit_trains_briefly_on_bytes_and_leaves_the_model_in_eval(tmp_path, monkeypatch):
    (tmp_path / "tinyshakespeare").mkdir()
    (tmp_path / "tinyshakespeare" / "input.txt").write_text("To be, or not to be, that is the question. " * 40)
    monkeypatch.setenv("TNN_DATA_DIR", str(tmp_path))
    torch.manual_seed(0)
    model = TnnForCausalLM(tiny_config("dense", causal=True, vocab_size=256))
    before = model.model.layers[0].gtu.token_mixer.rpe.out_proj.weight.detach().clone()
    record = compact_fit.train_briefly(model, steps=3)
    assert record["train_steps"] == 3 and record["first_loss"] > 0 and not model.training
    assert not torch.equal(before, model.model.layers[0].gtu.token_mixer.rpe.out_proj.weight)


# -- what make bench runs, and the rule that timing lives in the harness -------------------------------------------


def test_make_bench_covers_every_benchmark_script_into_distinct_folders():
    scripts = {path.name for path in (PROJECT_ROOT / "run_scripts").glob("bench_*.py")}
    # bench_all runs the plan, bench_compare needs two commits, bench_quality is a training run with its own command,
    # bench_scale_ladder (about 40 minutes) has its own target, make bench-ladder; bench_serving (about 20 minutes)
    # needs vLLM's venv (make vllm-install)
    assert {step.script.split("/")[-1] for step in plan.PLAN} == scripts - {"bench_all.py", "bench_compare.py",
                                                                             "bench_quality.py",
                                                                             "bench_scale_ladder.py",
                                                                             "bench_serving.py"}
    assert len(set(plan.STEP_NAMES)) == len(plan.PLAN)
    assert all(name.startswith("bench_") for name in plan.STEP_NAMES)
    for step in plan.PLAN:
        if step.script.endswith("bench_training.py"):
            bench_training.parse_args([*step.full, "--output_dir", "x"])
            bench_training.parse_args([*step.quick, "--output_dir", "x"])
    with pytest.raises(ValueError, match="--only"):
        plan.main(["--only", "bench_nothing"])


def test_benchmark_scripts_are_entry_points_into_the_package():
    """run_scripts/bench_*.py and accelerator_check.py hold no benchmark code: each imports one ``main`` from the
    recipes and calls it."""
    scripts = [*(PROJECT_ROOT / "run_scripts").glob("bench_*.py"), PROJECT_ROOT / "run_scripts" / "accelerator_check.py"]
    for script in scripts:
        code = [line for line in script.read_text().split('"""')[-1].splitlines() if line.strip()]
        assert len(code) <= 4, (script.name, code)
        assert re.fullmatch(r"from modeling_tnn\.recipes\.\w+\.\w+ import main", code[0]), (script.name, code[0])


def test_only_the_harness_reads_the_clock():
    """Every timing goes through the harness's timing loop: the monotonic clock is read in common/timing.py alone,
    besides the ListOps commands' wall time of a whole run (the data generation, the test evaluation), which times no
    benchmark, and the serving benchmark's vLLM side, which runs in vLLM's venv where the recipes cannot be
    imported."""
    readers = {str(path.relative_to(PROJECT_ROOT)) for folder in ("modeling_tnn", "run_scripts")
               for path in (PROJECT_ROOT / folder).rglob("*.py")
               if re.search(r"\bperf_counter\b", path.read_text())}
    assert readers == {"modeling_tnn/recipes/common/timing.py", "modeling_tnn/recipes/listops/commands.py",
                       "modeling_tnn/serving/bench_engine.py"}


@AT_SESSION_START.register("bench_compare")
def start_bench_compare(request: pytest.FixtureRequest) -> Started:
    """bench_compare.py of HEAD against itself, started at the session's first test: its ~15 s of checkouts and
    benchmark processes then run beside the suite's in-process tests. (HEAD as the run started is the one its record
    must name.)"""
    output_dir = request.getfixturevalue("tmp_path_factory").mktemp("bench_compare")
    log = output_dir.parent / f"{output_dir.name}.log"
    head = subprocess.run(["git", "-C", str(PROJECT_ROOT), "rev-parse", "HEAD"], capture_output=True, text=True)
    with open(log, "w") as output:
        process = subprocess.Popen([sys.executable, "run_scripts/bench_compare.py", "--base", "HEAD", "--head", "HEAD",
                                    "--benchmarks", "small_gpt_step", "--rounds", "2", "--output_dir",
                                    str(output_dir)], cwd=PROJECT_ROOT, stdout=output, stderr=subprocess.STDOUT,
                                   env={**os.environ, "PYTHONPATH": str(PROJECT_ROOT)})
    return Started(process, log, {"output_dir": output_dir, "head": head})


@pytest.fixture
def bench_compare(started_at_session_start,
                  request: pytest.FixtureRequest) -> tuple[subprocess.Popen, str, Path, subprocess.CompletedProcess]:
    """bench_compare.py's process once it ended, its output, its output folder and ``git rev-parse HEAD`` as it
    started."""
    started = AT_SESSION_START.take("bench_compare", started_at_session_start, request)
    started.process.wait(timeout=580)
    return started.process, started.log.read_text(), started.inputs["output_dir"], started.inputs["head"]


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_bench_compare_runs_two_commits_and_tables_both(bench_compare):
    done, output, tmp_path, head = bench_compare
    if head.returncode:
        pytest.skip("not a git checkout")
    assert done.returncode == 0, output[-3000:]
    record = json.loads((tmp_path / "results.json").read_text())
    (run,) = record["results"]["runs"]
    assert [side["commit"] for side in run["sources"]] == [head.stdout.strip()] * 2
    assert set(run["variants"]) == {"causal tnn-dense", "causal tnn-fd"}
    for row in run["variants"].values():
        assert row["a"]["rounds"] == row["b"]["rounds"] == 2 and row["ratio"] > 0
        assert row["paired_ratio_q1"] <= row["paired_ratio_median"] <= row["paired_ratio_q3"]
    table = (tmp_path / "table.md").read_text()
    assert "| small_gpt_step | causal tnn-dense |" in table and (tmp_path / "ab.png").is_file()
    worktrees = subprocess.run(["git", "-C", str(PROJECT_ROOT), "worktree", "list"], capture_output=True, text=True)
    assert "bench_compare_" not in worktrees.stdout  # the temporary checkouts are gone


def test_the_data_folder_beside_the_checkout_is_found_without_the_environment_variable(monkeypatch):
    from modeling_tnn.recipes.common import data_location

    monkeypatch.delenv("TNN_DATA_DIR", raising=False)
    assert data_location.PROJECT_ROOT == PROJECT_ROOT
    beside = PROJECT_ROOT.parent / "shared" / "data"
    assert data_location.find_data_dir() == (beside if beside.is_dir() else None)


def test_the_ab_figure_draws_a_ratio_outside_its_paired_quartiles(tmp_path):
    """On a noisy run the ratio of medians can fall outside the paired ratios' quartiles (it did: 1.169 against
    0.965-1.060); the figure still draws."""
    from modeling_tnn.recipes.benchmarks import compare

    row = dict(ratio=1.169, paired_ratio_q1=0.965, paired_ratio_q3=1.060)
    compare.plot([dict(benchmark="decode_2048", variants={"tnn dense batch 1": row})], tmp_path / "ab.png")
    assert (tmp_path / "ab.png").stat().st_size > 0
