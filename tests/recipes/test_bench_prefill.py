"""The prefill benchmark (issue 38's measurements) on a tiny rung at toy sizes: the folder's JSON, table and figure;
every row's ratios are those of the medians of its own timings; the error columns are the relative errors of the
last logits that the calls give when repeated here; the targets are judged by their rules; bad flags are named.
No timing is asserted."""

from __future__ import annotations

import json

import pytest

import torch

from modeling_tnn.modeling_tnn import CACHE_FIELD
from modeling_tnn.recipes.benchmarks import plan, prefill
from modeling_tnn.recipes.benchmarks.scale_ladder import QUICK_RUNGS, build_pair

LENGTHS, LONG, PROMPT, CHUNKS = (64, 128), 512, 256, 4


@pytest.fixture(scope="module")
def record(tmp_path_factory):
    folder = tmp_path_factory.mktemp("prefill")
    prefill.main(["--quick", "--rungs", "tiny-32", "--lengths", ",".join(map(str, LENGTHS)), "--long_length",
                  str(LONG), "--chunk_prompt", str(PROMPT), "--chunks", str(CHUNKS), "--rounds", "2",
                  "--output_dir", str(folder)])
    return folder, json.loads((folder / "results.json").read_text())


def test_the_folder_holds_the_command_the_quick_label_the_table_and_the_figure(record):
    folder, data = record
    assert data["benchmark"] == "bench_prefill"
    assert data["command"].startswith("python run_scripts/bench_prefill.py --quick --rungs tiny-32")
    assert (folder / "figure.png").read_bytes()[:4] == b"\x89PNG"
    table = (folder / "table.md").read_text()
    assert "**Quick run" in table and prefill.FULL_COMMAND in table
    for n in (*LENGTHS, LONG):
        assert f"| tiny-32 | {n:,} |" in table
    assert f"| tiny-32 | {PROMPT:,} | {CHUNKS} x {PROMPT // CHUNKS:,} |" in table


def test_every_ratio_is_of_the_medians_of_its_own_rounds(record):
    _, data = record
    (rung,) = data["results"]["rungs"]
    assert [row["tokens"] for row in rung["prefill"]] == list(LENGTHS)
    assert [row["tokens"] for row in rung["long"]] == [LONG]
    for row in rung["prefill"] + rung["long"]:
        medians = {key: row["timings"][key]["median_s"] for key in prefill.VARIANTS}
        assert row["timings"]["state"]["rounds"] == (2 if row["tokens"] != LONG else 1)
        assert [row["plain_s"], row["state_s"], row["llama_s"]] == [medians[key] for key in prefill.VARIANTS]
        assert row["state_over_plain"] == pytest.approx(medians["state"] / medians["plain"])
        assert row["llama_over_tnn"] == pytest.approx(medians["llama"] / medians["state"])
        assert set(row["peak_mb"]) == set(prefill.VARIANTS)
        assert all(peak is None or peak >= 0 for peak in row["peak_mb"].values())
    chunked = rung["chunked"]
    whole, parts = chunked["timings"]["one-shot"], chunked["timings"]["chunked"]
    assert (chunked["tokens"], chunked["chunks"], chunked["chunk_tokens"]) == (PROMPT, CHUNKS, PROMPT // CHUNKS)
    assert chunked["chunked_over_one_shot"] == pytest.approx(parts["median_s"] / whole["median_s"])
    assert chunked["first_chunk_s"] == parts["chunk 1_median_s"]
    assert chunked["last_chunk_s"] == parts[f"chunk {CHUNKS}_median_s"]


def test_the_error_columns_are_the_last_logits_relative_errors(record):
    _, data = record
    (rung,) = data["results"]["rungs"]
    tnn, _ = build_pair(QUICK_RUNGS["tiny-32"], 0)
    ids = torch.randint(1, tnn.config.vocab_size, (1, PROMPT), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        tnn(input_ids=torch.ones(1, prefill.FIT_TOKENS, dtype=torch.long), use_cache=True)
        whole = tnn(input_ids=ids, use_cache=True, logits_to_keep=1).logits[0, -1]
        out = None
        for piece in ids.chunk(CHUNKS, dim=1):
            cache = {} if out is None else {CACHE_FIELD: getattr(out, CACHE_FIELD)}
            out = tnn(input_ids=piece, use_cache=True, logits_to_keep=1, **cache)
    expected = (whole - out.logits[0, -1]).abs().max() / whole.abs().max()
    assert rung["chunked"]["error"] == pytest.approx(expected.item(), rel=1e-3, abs=1e-9)
    assert 0 <= rung["chunked"]["error"] < 1e-4  # the same prompt, read in chunks: float32 rounding apart
    assert all(0 <= row["state_error"] < 1e-4 for row in rung["prefill"] + rung["long"])
    assert prefill.relative_error(torch.tensor([1.0, -2.0]), torch.tensor([1.5, -2.0])) == pytest.approx(0.25)


def test_the_targets_follow_their_rules(record):
    _, data = record
    (rung,) = data["results"]["rungs"]
    goals = prefill.targets([rung])
    assert goals == data["results"]["targets"]
    # The Llama target exists at the lengths only: relabel one row as 2,048 tokens to see it appear.
    relabelled = dict(rung, prefill=[dict(rung["prefill"][0], tokens=2048, llama_over_tnn=0.94)])
    llama = [goal for goal in prefill.targets([relabelled]) if goal["target"].startswith("Llama")]
    assert [(goal["target"], goal["met"]) for goal in llama] == [("Llama / TNN prefill @2048", False)]
    assert not any(goal["target"].startswith("Llama") for goal in goals)  # 64 and 128 tokens name no Llama target
    for goal in goals:
        sign, bound = goal["rule"].split()
        limit = float(bound.rstrip("x"))
        assert goal["met"] == (goal["measured"] <= limit if sign == "<=" else goal["measured"] >= limit)
    assert len(goals) == len(LENGTHS) + 2  # a state target per length, the chunked ratio and its error


def test_bad_flags_are_named_and_the_plan_parses():
    with pytest.raises(ValueError, match="--rungs"):
        prefill.parse_args(["--rungs", "tiny-32"])  # a quick rung without --quick
    with pytest.raises(ValueError, match="--long_rungs"):
        prefill.parse_args(["--quick", "--long_rungs", "48.7M"])
    with pytest.raises(ValueError, match="--chunk_prompt"):
        prefill.parse_args(["--chunk_prompt", "100", "--chunks", "3"])
    with pytest.raises(ValueError, match="--lengths"):
        prefill.parse_args(["--lengths", "2048,x"])
    (step,) = [step for step in plan.PLAN if step.folder == "bench_prefill"]
    full, quick = prefill.parse_args(list(step.full)), prefill.parse_args(list(step.quick))
    assert full.rungs == ["6M", "48.7M", "125M"] and full.lengths == [2048, 8192] and full.long_length == 32768
    assert full.long_rungs == ["6M", "48.7M"]
    assert (full.chunk_prompt, full.chunks) == (16384, 8)
    assert quick.rungs == list(QUICK_RUNGS)
