"""run_scripts/accelerator_check.py: its CPU dry run (``--device cpu --quick``) end to end, and a device that is not
there refused before anything runs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from modeling_tnn.recipes.benchmarks import accelerator_check as check

from tests.support import AT_SESSION_START, PROJECT_ROOT, Started

SCRIPT = PROJECT_ROOT / "run_scripts" / "accelerator_check.py"


def test_an_absent_or_malformed_device_is_refused(tmp_path, capsys):
    for device, message in [("gpu0", "--device 'gpu0' is not a torch device"), ("meta:7", "device(s)")]:
        assert check.main(["--device", device, "--output_dir", str(tmp_path / "out")]) == 2
        assert message in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


@AT_SESSION_START.register("dry_run")
def start_dry_run(request: pytest.FixtureRequest) -> Started:
    """The dry run, started at the session's first test: its ~45 s of subprocesses (the device tests, two benchmark
    sweeps) then run beside the suite's in-process tests, which keep to one thread."""
    output_dir = request.getfixturevalue("tmp_path_factory").mktemp("accelerator_check")
    log = output_dir.parent / f"{output_dir.name}.log"  # beside: the check's own files are what the test lists
    with open(log, "w") as output:
        process = subprocess.Popen([sys.executable, str(SCRIPT), "--device", "cpu", "--quick", "--output_dir",
                                    str(output_dir)], stdout=output, stderr=subprocess.STDOUT)
    return Started(process, log, {"output_dir": output_dir})


@pytest.fixture
def dry_run(started_at_session_start, request: pytest.FixtureRequest) -> tuple[subprocess.Popen, str, Path]:
    """The dry run's process once it ended, its output and its output folder."""
    started = AT_SESSION_START.take("dry_run", started_at_session_start, request)
    started.process.wait(timeout=380)
    return started.process, started.log.read_text(), started.inputs["output_dir"]


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_cpu_quick_dry_run(dry_run):
    done, output, tmp_path = dry_run
    assert done.returncode == 0, output[-4000:]
    summary = json.loads((tmp_path / "accelerator_check.json").read_text())
    assert summary["ok"] and summary["device"] == "cpu" and summary["quick"]
    tests = summary["tests"]
    assert tests["passed"] >= 15 and tests["failed"] == tests["errors"] == 0
    for bench, figure in [("bench_training", "training.png"), ("bench_generation", "generation.png")]:
        assert summary["benchmarks"][bench]["returncode"] == 0
        assert {"results.json", "table.md", figure} <= {p.name for p in (tmp_path / bench).iterdir()}
        assert summary["benchmarks"][bench]["command"].startswith(f"python run_scripts/{bench}.py")
