"""The scale ladder benchmark on its two tiny rungs (``--quick``): the folder's JSON, table and figure, values that
are positive and agree with each other (Llama's KV bytes from its shapes, TNN's state the same per sequence at every
batch and context, the free mixer faster than attention's step), rows dropped over the KV limit, and the part 5
target rules."""

from __future__ import annotations

import json

import pytest

import torch

from modeling_tnn.recipes.benchmarks import scale_ladder
from modeling_tnn.recipes.benchmarks.scale_ladder_report import targets, training_target
from modeling_tnn.recipes.benchmarks.scale_ladder_training import FREE_MIXER

from tests.support import PROJECT_ROOT

MAX_KV_GB = 0.02  # drops Llama's batch-8 rows of 8,192 tokens (tiny-32: 34 MB) and of 2,048 at tiny-64 (25 MB)
# (tiny-64 also drops its training at 2,048 on purpose: QUICK_RUNGS)


@pytest.fixture(scope="module")
def ladder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("ladder")
    scale_ladder.main(["--quick", "--isolate", "0", "--max_kv_gb", str(MAX_KV_GB), "--output_dir", str(folder)])
    return folder, json.loads((folder / "results.json").read_text())


def test_the_folder_holds_the_command_every_rung_and_the_figure(ladder):
    folder, record = ladder
    assert record["benchmark"] == "scale ladder"
    assert record["command"].startswith("python run_scripts/bench_scale_ladder.py --quick")
    rungs = record["results"]["rungs"]
    assert [r["rung"] for r in rungs] == list(scale_ladder.QUICK_RUNGS)
    assert (folder / "ladder.png").read_bytes()[:4] == b"\x89PNG"
    table = (folder / "table.md").read_text()
    for heading in ("Training step", "Decode, ms per token", "Prefill of 256 tokens", "Targets of issue 29",
                    "Rows dropped"):
        assert heading in table
    target_rows = [line for line in table.splitlines() if line.startswith("| tiny-") and ("PASS" in line
                                                                                          or "FAIL" in line)]
    assert len(target_rows) == len(rungs)


def test_every_measurement_is_there_and_positive(ladder):
    _, record = ladder
    settings = record["settings"]
    for rung in record["results"]["rungs"]:
        params = rung["parameters"]
        assert abs(params["llama"] / params["tnn"] - 1) < 0.01  # matched
        assert rung["parameter_bytes"]["tnn"] == 4 * params["tnn"]
        assert rung["fit"]["fit_s"] > 0 and rung["fit"]["channels"] > 0 and rung["process_peak_rss_mb"] > 0
        assert len(rung["fit"]["plans"]) == rung["tnn_config"]["layers"]
        training = {(t["model"], t["n"]): t for t in rung["training"]}
        lengths = [n for n in settings["lengths"] if f"train {n}" not in scale_ladder.QUICK_RUNGS[rung["rung"]].drops]
        assert set(training) == {(m, n) for m in ("tnn", "llama", "llama free mixer") for n in lengths}
        for t in training.values():
            assert t["step_ms"] > 0 and t["batch"] == max(1, rung["tokens_per_step"] // t["n"])
            assert t["forward_backward_median_s"] > 0 and t["optimizer_median_s"] > 0
            assert t["step_peak_mb"] is None or t["step_peak_mb"] >= 0
        assert {p["model"] for p in rung["prefill"]} == {"tnn", "llama"}
        assert all(p["seconds"] > 0 and p["tokens"] == settings["prefill_length"] for p in rung["prefill"])
        for d in rung["decode"]:
            assert d["ms_per_token"] > 0 and d["rounds"] == settings["rounds"]


def test_state_bytes_follow_the_shapes(ladder):
    _, record = ladder
    for rung in record["results"]["rungs"]:
        llama = rung["llama_config"]
        head_dim = llama["hidden_size"] // llama["heads"]
        for tokens, measured in rung["llama_kv_bytes_per_sequence"].items():
            assert measured == 2 * llama["layers"] * llama["kv_heads"] * head_dim * int(tokens) * 4
        for d in rung["decode"]:
            assert d["state_bytes"] == d["batch"] * d["state_bytes_per_sequence"]
            if d["model"] == "llama":  # the random cache of the context's length, as built
                assert d["state_bytes_per_sequence"] == rung["llama_kv_bytes_per_sequence"][str(d["context"])]
        tnn = {d["state_bytes_per_sequence"] for d in rung["decode"] if d["model"] == "tnn"}
        assert len(tnn) == 1 and tnn.pop() > 0  # the compact state: one size at every batch and context


def test_llama_rows_over_the_kv_limit_are_dropped_and_said(ladder):
    folder, record = ladder
    dropped = {(d["rung"], d["row"]) for d in record["results"]["dropped"]}
    assert dropped == {("tiny-32", "decode llama 8 8192"), ("tiny-64", "decode llama 8 2048"),
                       ("tiny-64", "decode llama 8 8192"), ("tiny-64", "train 2048")}
    assert all(f"over --max_kv_gb {MAX_KV_GB:g}" in d["reason"] for d in record["results"]["dropped"]
               if d["row"].startswith("decode"))
    rungs = {r["rung"]: r for r in record["results"]["rungs"]}
    assert not any(d["model"] == "llama" and d["batch"] == 8 and d["context"] == 2048
                   for d in rungs["tiny-64"]["decode"])
    names = {t["target"] for t in record["results"]["targets"]["tiny-64"]}
    assert "decode b8 @2048" not in names and "decode b1 @2048" in names  # no target without its Llama row
    assert "training n=2048" not in names and "training n=512" in names
    table = (folder / "table.md").read_text()
    assert "| tiny-64 | decode llama 8 2048 |" in table and "| tiny-64 | train 2048 | an example" in table


def test_targets_are_the_ratios_of_the_rows(ladder):
    _, record = ladder
    for rung in record["results"]["rungs"]:
        rows = {t["target"]: t for t in record["results"]["targets"][rung["rung"]]}
        decode = {(d["model"], d["batch"], d["context"]): d["ms_per_token"] for d in rung["decode"]}
        assert rows["decode b1 @256"]["ratio"] == pytest.approx(decode["llama", 1, 256] / decode["tnn", 1, 256])
        assert rows["decode b1 @2048"]["required"] == 1.5
        steps = {(t["model"], t["n"]): t["step_ms"] for t in rung["training"]}
        for n in sorted({t["n"] for t in rung["training"]}):
            row = rows[f"training n={n}"]
            assert row["bound"] == pytest.approx(steps["llama", n] / steps["llama free mixer", n])
            assert row["passed"] == (row["ratio"] >= row["required"])


def test_training_target_rules():
    assert training_target(512, 1.5) == (1.0, "1.0x")
    assert training_target(512, 1.02)[0] == pytest.approx(0.969)  # within 5% of a bound below 1.05
    assert training_target(2048, 1.4)[0] == 1.3
    assert training_target(2048, 1.2)[0] == pytest.approx(1.08)  # within 10% of a bound below 1.3
    assert training_target(1024, 2.0) is None
    record = dict(decode=[dict(model="tnn", batch=1, context=256, ms_per_token=2.0, state_bytes_per_sequence=10),
                          dict(model="llama", batch=1, context=256, ms_per_token=1.0, state_bytes_per_sequence=20)],
                  training=[dict(model="tnn", n=512, step_ms=100.0), dict(model="llama", n=512, step_ms=100.0),
                            dict(model="llama free mixer", n=512, step_ms=99.0)],
                  llama_kv_bytes_per_sequence={"256": 20})
    rows = {t["target"]: t for t in targets(record)}
    assert rows["decode b1 @256"]["ratio"] == 0.5 and not rows["decode b1 @256"]["passed"]
    assert rows["training n=512"]["passed"] and rows["training n=512"]["ratio"] == 1.0
    assert rows["state <= Llama KV @256"]["passed"]


def test_the_free_mixer_skips_attention_and_keeps_every_gradient():
    torch.manual_seed(0)
    _, llama = scale_ladder.build_pair(scale_ladder.QUICK_RUNGS["tiny-32"], seed=0)
    ids = torch.randint(0, llama.config.vocab_size, (2, 16))
    with torch.no_grad():
        attended = llama(input_ids=ids).logits
        llama.set_attn_implementation(FREE_MIXER)
        free = llama(input_ids=ids).logits
    assert not torch.allclose(attended, free)  # the attention call is replaced, not left in place
    llama(input_ids=ids, labels=ids).loss.backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in llama.parameters())  # q, k, v projections too
    llama.set_attn_implementation("sdpa")
    with torch.no_grad():
        assert torch.equal(llama(input_ids=ids).logits, attended)


def test_a_failed_rung_is_reported_beside_the_others(tmp_path, monkeypatch):
    measure = scale_ladder.measure_rung
    monkeypatch.setattr(scale_ladder, "run_rung", lambda args, rung, argv: "its process failed (exit -9)"
                        if rung.name == "tiny-64" else measure(args, rung))
    with pytest.raises(SystemExit, match="tiny-64"):
        scale_ladder.main(["--quick", "--contexts", "256", "--batches", "1", "--lengths", "512",
                           "--output_dir", str(tmp_path)])
    record = json.loads((tmp_path / "results.json").read_text())["results"]
    assert [r["rung"] for r in record["rungs"]] == ["tiny-32"]
    assert {"rung": "tiny-64", "row": "the whole rung", "reason": "its process failed (exit -9)"} in record["dropped"]


def test_bad_rungs_are_refused():
    with pytest.raises(ValueError, match="--rungs"):
        scale_ladder.parse_args(["--rungs", "6M,1B"])
    with pytest.raises(ValueError, match="with --quick"):
        scale_ladder.parse_args(["--quick", "--rungs", "6M"])
    with pytest.raises(ValueError, match="--parts"):
        scale_ladder.parse_args(["--parts", "decode,speed"])
    assert [r.name for r in scale_ladder.parse_args([]).rung_list] == ["6M", "48.7M", "125M", "350M"]


def test_the_make_target_runs_the_ladder():
    makefile = (PROJECT_ROOT / "Makefile").read_text()
    assert "bench-ladder:" in makefile and "run_scripts/bench_scale_ladder.py" in makefile


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_each_rung_runs_in_its_own_process(tmp_path):
    scale_ladder.main(["--quick", "--rungs", "tiny-32", "--contexts", "256", "--batches", "1", "--lengths", "512",
                       "--output_dir", str(tmp_path)])
    record = json.loads((tmp_path / "results.json").read_text())
    (rung,) = record["results"]["rungs"]
    assert rung["rung"] == "tiny-32" and rung["process_peak_rss_mb"] > 0
    assert {d["model"] for d in rung["decode"]} == {"tnn", "llama"}
