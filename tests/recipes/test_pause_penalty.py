"""The pause-penalty benchmark on toy settings: the folder's JSON, table and figure; one cell per probe and pause;
the sampler runs its operator twice (the first call untimed) around its pause; bad flags name themselves."""

from __future__ import annotations

import json

import pytest

from modeling_tnn.recipes.benchmarks import pause_penalty


def test_the_folder_holds_every_probe_at_every_pause(tmp_path):
    pause_penalty.main(["--pauses_ms", "0,1", "--rounds", "3", "--output_dir", str(tmp_path)])
    data = json.loads((tmp_path / "results.json").read_text())
    assert data["benchmark"] == "bench_pause_penalty"
    assert data["command"].startswith("python run_scripts/bench_pause_penalty.py --pauses_ms 0,1")
    assert [row["probe"] for row in data["results"]] == list(pause_penalty.probes())
    for row in data["results"]:
        assert set(row["pauses"]) == {"0.0", "1.0"}  # JSON keys
        for cell in row["pauses"].values():
            assert 0 < cell["q1_us"] <= cell["median_us"] <= cell["q3_us"]
    text = (tmp_path / "table.md").read_text()
    assert "| operator | after 0 ms | after 1 ms |" in text
    assert all(f"| {row['probe']} |" in text for row in data["results"])
    assert (tmp_path / "figure.png").read_bytes()[:4] == b"\x89PNG"


def test_the_sampler_times_the_second_call_after_its_pause():
    calls = []
    sample = pause_penalty.after_pause(lambda: calls.append(pause_penalty.CLOCK()), 0.02)
    seconds = sample()
    assert len(calls) == 2 and calls[1] - calls[0] >= 0.02
    assert 0 < seconds < 0.02  # the call alone, not the pause


@pytest.mark.parametrize("argv, flag", [(["--pauses_ms", "1,x"], "--pauses_ms"), (["--pauses_ms", "-1"], "--pauses_ms"),
                                        (["--pauses_ms", ""], "--pauses_ms"), (["--rounds", "0"], "--rounds")])
def test_bad_flags_name_themselves(argv, flag):
    with pytest.raises(ValueError, match=flag):
        pause_penalty.parse_args(argv)
