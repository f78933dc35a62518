"""run_scripts/accelerator_check.py: its CPU dry run (``--device cpu --quick``) end to end, and a device that is not
there refused before anything runs."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from modeling_tnn.recipes.benchmarks import accelerator_check as check

from tests.support import PROJECT_ROOT

SCRIPT = PROJECT_ROOT / "run_scripts" / "accelerator_check.py"


def test_an_absent_or_malformed_device_is_refused(tmp_path, capsys):
    for device, message in [("gpu0", "--device 'gpu0' is not a torch device"), ("meta:7", "device(s)")]:
        assert check.main(["--device", device, "--output_dir", str(tmp_path / "out")]) == 2
        assert message in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_cpu_quick_dry_run(tmp_path):
    done = subprocess.run([sys.executable, str(SCRIPT), "--device", "cpu", "--quick", "--output_dir", str(tmp_path)],
                          capture_output=True, text=True, timeout=380)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    summary = json.loads((tmp_path / "accelerator_check.json").read_text())
    assert summary["ok"] and summary["device"] == "cpu" and summary["quick"]
    tests = summary["tests"]
    assert tests["passed"] >= 15 and tests["failed"] == tests["errors"] == 0
    for bench, figure in [("bench_training", "training.png"), ("bench_generation", "generation.png")]:
        assert summary["benchmarks"][bench]["returncode"] == 0
        assert {"results.json", "table.md", figure} <= {p.name for p in (tmp_path / bench).iterdir()}
        assert summary["benchmarks"][bench]["command"].startswith(f"python run_scripts/{bench}.py")
