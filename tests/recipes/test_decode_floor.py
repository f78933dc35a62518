"""The decode-floor benchmark on a tiny rung: the folder's JSON, table and figure; the linear floor replays exactly
the Linear calls of a step (four per TNN block and seven per Llama layer, plus the head); the parts add up; the parts
timer leaves the states and norms as they were."""

from __future__ import annotations

import json

import pytest

import torch

from modeling_tnn.recipes.benchmarks import decode_floor
from modeling_tnn.recipes.benchmarks.scale_ladder import QUICK_RUNGS, build_pair, tnn_state
from modeling_tnn.rpe import SimpleRMSNorm


@pytest.fixture(scope="module")
def record(tmp_path_factory):
    folder = tmp_path_factory.mktemp("floor")
    decode_floor.main(["--rungs", "tiny-32", "--context", "64", "--rounds", "2", "--output_dir", str(folder)])
    return folder, json.loads((folder / "results.json").read_text())


def test_the_folder_holds_the_command_the_table_and_the_figure(record):
    folder, data = record
    assert data["benchmark"] == "bench_decode_floor"
    assert data["command"].startswith("python run_scripts/bench_decode_floor.py --rungs tiny-32")
    assert (folder / "figure.png").read_bytes()[:4] == b"\x89PNG"
    assert "| tiny-32 b1 @64 |" in (folder / "table.md").read_text()


def test_the_floor_replays_every_linear_call_and_the_parts_add_up(record):
    _, data = record
    (row,) = data["results"]
    tnn, llama = build_pair(QUICK_RUNGS["tiny-32"], 0)
    depth = tnn.config.num_hidden_layers
    assert row["linear_calls"] == {"tnn": 4 * depth + 1, "llama": 7 * llama.config.num_hidden_layers + 1}
    assert 0 < row["tnn_state_ms"] < row["tnn_step_ms"] and 0 < row["tnn_linear_ms"] < row["tnn_step_ms"]
    assert 0 < row["tnn_norms_ms"] < row["tnn_step_ms"]
    parts = row["tnn_linear_ms"] + row["tnn_state_ms"] + row["tnn_norms_ms"] + row["tnn_other_ms"]
    assert parts == pytest.approx(row["tnn_step_ms"])
    assert row["ratio"] == pytest.approx(row["llama_step_ms"] / row["tnn_step_ms"])
    assert row["ceiling"] == pytest.approx(row["llama_step_ms"] / row["tnn_linear_ms"])
    assert row["budget_ms"] == pytest.approx(row["llama_step_ms"] / 1.5 - row["tnn_linear_ms"])
    assert row["ratio_static"] == pytest.approx(row["llama_static_step_ms"] / row["tnn_step_ms"])
    q1, median, q3 = row["beyond_linear_paired"]  # the per-round ratios' quartiles, in order
    assert q1 <= median <= q3 and median > -1


def test_the_parts_timer_counts_the_steps_and_the_norms_and_restores_the_model():
    tnn, _ = build_pair(QUICK_RUNGS["tiny-32"], 0)
    norms = decode_floor.block_norms(tnn)
    assert all(isinstance(module, (SimpleRMSNorm, torch.nn.LayerNorm)) for module in norms)
    assert len(norms) == 2 * tnn.config.num_hidden_layers + (tnn.config.final_norm != "none")
    with torch.no_grad():
        cache = tnn_state(tnn, 1, 16)
        states = [layer.state for layer in cache.layers]
        with decode_floor.parts_clock(tnn, cache) as spent:
            tnn(input_ids=torch.ones(1, 1, dtype=torch.long), use_cache=True, cache=cache)
        assert spent["state"][0] > 0 and spent["norms"][0] > 0
        assert all("step" not in vars(state) for state in states)
        assert not any(module._forward_hooks or module._forward_pre_hooks for module in norms)


def test_the_compiled_step_gets_its_column(tmp_path, monkeypatch):
    """--compiled 1 times the step through torch.compile on the same cache (here dynamo with the eager backend:
    inductor's C++ build takes minutes), and the table gives it with its share beyond the linear calls; without it
    the cell is a dash."""
    compile_eager = torch.compile
    monkeypatch.setattr(torch, "compile", lambda model: compile_eager(model, backend="eager"))
    torch._dynamo.reset()
    decode_floor.main(["--rungs", "tiny-32", "--context", "64", "--rounds", "1", "--compiled", "1",
                       "--output_dir", str(tmp_path)])
    (row,) = json.loads((tmp_path / "results.json").read_text())["results"]
    assert row["tnn_compiled_step_ms"] > 0
    beyond = 100 * (row["tnn_compiled_step_ms"] / row["tnn_linear_ms"] - 1)
    assert f"| {row['tnn_compiled_step_ms']:.2f} ({beyond:.1f}%) |" in (tmp_path / "table.md").read_text()
    assert decode_floor.compiled_cell({"tnn_compiled_step_ms": None}) == "-"


def test_the_narrow_head_gets_its_column_and_the_head_comes_back(tmp_path):
    """--narrow_head 1 times TNN's step and its linear calls with a hidden x hidden head (the floor then replays that
    head), and the table gives its share beyond the linear calls and the head's share of the excess; without it the
    cell is a dash. The swap restores the model's own head, on error too."""
    decode_floor.main(["--rungs", "tiny-32", "--context", "64", "--rounds", "1", "--narrow_head", "1",
                       "--output_dir", str(tmp_path)])
    (row,) = json.loads((tmp_path / "results.json").read_text())["results"]
    assert 0 < row["narrow_head_linear_ms"] < row["narrow_head_step_ms"]
    narrow_ratio = row["narrow_head_step_ms"] / row["narrow_head_linear_ms"]
    assert row["narrow_head_beyond_linear"] == pytest.approx(narrow_ratio - 1)
    assert row["head_share_ms"] == pytest.approx(row["spent_ms"] - (row["narrow_head_step_ms"]
                                                                    - row["narrow_head_linear_ms"]))
    cell = f"| {100 * row['narrow_head_beyond_linear']:.1f}% ({row['head_share_ms']:.2f} ms) |"
    assert cell in (tmp_path / "table.md").read_text()
    assert decode_floor.narrow_head_cell({"narrow_head_beyond_linear": None}) == "-"

    tnn, _ = build_pair(QUICK_RUNGS["tiny-32"], 0)
    head, width = tnn.lm_head, tnn.config.hidden_size
    with torch.no_grad():
        cache = tnn_state(tnn, 1, 16)
        step, floor = decode_floor.narrow_head_work(tnn, cache, 1)
        seen = cache.get_seq_length()
        step()
        assert cache.get_seq_length() == seen + decode_floor.DECODE_TOKENS and tnn.lm_head is head
        with pytest.raises(RuntimeError, match="inside"):
            with decode_floor.swapped_head(tnn, torch.nn.Linear(width, width)):
                assert tnn.lm_head is not head
                raise RuntimeError("inside")
    assert tnn.lm_head is head


def test_bad_arguments_name_the_flag():
    with pytest.raises(ValueError, match="--rungs"):
        decode_floor.parse_args(["--rungs", "nope"])


def test_the_static_cache_holds_the_same_keys_and_values_and_gives_the_same_logits():
    from modeling_tnn.recipes.benchmarks.generation import kv_cache

    _, llama = build_pair(QUICK_RUNGS["tiny-32"], 0)
    token = torch.ones(1, 1, dtype=torch.long)
    logits = []
    for room in (None, 4):
        torch.manual_seed(3)
        cache = kv_cache(llama, 1, 16, room=room)
        with torch.no_grad():
            logits.append(llama(input_ids=token, use_cache=True, past_key_values=cache).logits)
        assert int(cache.get_seq_length()) == 17
    torch.testing.assert_close(logits[0], logits[1], atol=1e-5, rtol=1e-5)
