#!/usr/bin/env python
"""The one command to run the day an accelerator is there: the device-sensitive tests on that device, a short
training and generation benchmark sweep, and one JSON summary.

    python run_scripts/accelerator_check.py --output_dir results/accelerator_check_cuda        # --device cuda
    python run_scripts/accelerator_check.py --device cpu --quick --output_dir outputs/check    # the dry run

1. Tests: ``tests/test_device.py`` (forward and gradients against float64 on CPU, cached decoding against the no-cache
   forward, fp16/bf16 autocast: projections in low precision, FFTs in float32) and ``tests/test_mixed_precision.py``
   (``--mixed_precision bf16`` through the training setup), with ``TNN_TEST_DEVICE=<device>``; for ``--device cpu``
   no GPU is visible to them. Log: ``tests.log``, JUnit XML: ``tests.xml``.
2. ``run_scripts/bench_training.py`` and ``run_scripts/bench_generation.py`` at reduced sizes (smaller still with
   ``--quick``), each writing its table, JSON and PNG under ``<output_dir>/<bench>/``. They time the CPU (they take
   no device flag); the summary says so.
3. ``<output_dir>/accelerator_check.json``: the device, torch, every step's command, status and time, the test counts.

Exit status 0 when every step passed, 1 otherwise, 2 for a device that is not there. ``--quick`` takes under two
minutes on 2 CPU cores.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import time
import xml.etree.ElementTree as ElementTree
from pathlib import Path
from typing import Any

import torch

PROJECT_ROOT = Path(__file__).resolve().parents[1]
DEVICE_TESTS = ("tests/test_device.py", "tests/test_mixed_precision.py")
SUMMARY_FILE = "accelerator_check.json"
# Reduced sweeps: the flags each benchmark already has; --quick keeps the whole check under two minutes on 2 cores.
BENCH_FLAGS = {
    "bench_training": {
        True: ["--hidden_size", "64", "--lengths", "64,256", "--memory_lengths", "", "--tokens", "512",
               "--rounds", "2", "--families", "causal", "--models", "tnn-dense,tnn-fd,gpt2"],
        False: ["--hidden_size", "128", "--lengths", "128,512,2048", "--memory_lengths", "512,2048",
                "--tokens", "4096", "--rounds", "3", "--families", "causal,masked"],
    },
    "bench_generation": {
        True: ["--contexts", "128,512", "--batch_sizes", "1", "--hidden_size", "64", "--num_layers", "2",
               "--vocab_size", "512", "--rounds", "3", "--no_cache_max_context", "128", "--prefill_length", "256",
               "--prefill_rounds", "1", "--error_multiples", "1,2", "--error_tokens", "8", "--etsc_length", "64"],
        False: ["--contexts", "128,1024,4096", "--batch_sizes", "1,8", "--hidden_size", "128", "--num_layers", "4",
                "--rounds", "5", "--prefill_length", "2048", "--prefill_rounds", "2", "--error_multiples", "1,4",
                "--error_tokens", "16"],
    },
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda", help="a torch device: cuda (default), cuda:1, cpu, xpu, mps")
    parser.add_argument("--quick", action="store_true", help="the smallest sweeps (under two minutes on 2 cores)")
    parser.add_argument("--output_dir", default="results/accelerator_check", type=Path)
    return parser.parse_args(argv)


def device_report(name: str) -> dict[str, Any]:
    """What the check runs on. Raises ``ValueError`` naming ``--device`` for a malformed or absent device."""
    try:
        device = torch.device(name)
    except RuntimeError as error:
        raise ValueError(f"--device {name!r} is not a torch device ({error}); e.g. cuda, cuda:1, cpu.") from None
    report: dict[str, Any] = {"device": name, "torch": torch.__version__, "cuda": torch.version.cuda}
    if device.type == "cpu":
        return {**report, "device_name": "cpu", "bf16_supported": True}
    backend = getattr(torch, device.type, None)
    count = backend.device_count() if backend is not None and backend.is_available() else 0
    if (device.index or 0) >= count:
        raise ValueError(f"--device {name!r}: this machine has {count} {device.type} device(s) (torch "
                         f"{torch.__version__}); --device cpu runs the dry run.")
    report["device_name"] = backend.get_device_name(device.index or 0) if hasattr(backend, "get_device_name") else name
    if device.type == "cuda":
        report["capability"] = ".".join(map(str, torch.cuda.get_device_capability(device.index or 0)))
        report["bf16_supported"] = torch.cuda.is_bf16_supported()
    return report


def shown(command: list[str]) -> str:
    """``command`` as a user would type it from the project root: ``python``, project paths relative."""
    def relative(arg: str) -> str:
        path = Path(arg)
        return str(path.relative_to(PROJECT_ROOT)) if path.is_absolute() and path.is_relative_to(PROJECT_ROOT) else arg
    return shlex.join(["python" if command[0] == sys.executable else command[0], *map(relative, command[1:])])


def run_step(name: str, command: list[str], env: dict[str, str], output_dir: Path) -> dict[str, Any]:
    """Run one step from the project root, its output in ``<output_dir>/<name>.log``."""
    log = output_dir / f"{name}.log"
    start = time.perf_counter()
    with open(log, "w") as handle:
        done = subprocess.run(command, cwd=PROJECT_ROOT, env=env, stdout=handle, stderr=subprocess.STDOUT)
    seconds = time.perf_counter() - start
    status = "passed" if done.returncode == 0 else f"FAILED (status {done.returncode})"
    print(f"{name}: {status} in {seconds:.0f} s (log: {log})")
    return {"command": shown(command), "returncode": done.returncode, "seconds": round(seconds, 1),
            "log": log.name}


def test_counts(junit_xml: Path) -> dict[str, int]:
    """Passed / failed / errors / skipped from pytest's JUnit XML (zeros when pytest wrote none)."""
    if not junit_xml.is_file():
        return {"passed": 0, "failed": 0, "errors": 0, "skipped": 0}
    suite = ElementTree.parse(junit_xml).getroot()
    suite = suite if suite.tag == "testsuite" else suite.find("testsuite")
    total, failed, errors, skipped = (int(suite.get(key, 0)) for key in ("tests", "failures", "errors", "skipped"))
    return {"passed": total - failed - errors - skipped, "failed": failed, "errors": errors, "skipped": skipped}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        summary: dict[str, Any] = {**device_report(args.device), "quick": args.quick}
    except ValueError as error:
        print(f"accelerator_check.py: error: {error}", file=sys.stderr)
        return 2
    if not all((PROJECT_ROOT / path).is_file() for path in DEVICE_TESTS):
        print(f"accelerator_check.py: error: {', '.join(DEVICE_TESTS)} not found: run it from a source checkout.",
              file=sys.stderr)
        return 2
    output_dir = args.output_dir.resolve()
    output_dir.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, TNN_TEST_DEVICE=args.device)
    if torch.device(args.device).type == "cpu":
        env["CUDA_VISIBLE_DEVICES"] = ""  # the training-setup tests pick a GPU by themselves when one is visible
    start = time.perf_counter()

    junit = output_dir / "tests.xml"
    tests = run_step("tests", [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *DEVICE_TESTS,
                               "--junitxml", str(junit)], env, output_dir)
    summary["tests"] = {**tests, **test_counts(junit)}
    summary["benchmarks"] = {}
    for bench, flags in BENCH_FLAGS.items():
        folder = output_dir / bench
        step = run_step(bench, [sys.executable, str(PROJECT_ROOT / "run_scripts" / f"{bench}.py"), *flags[args.quick],
                                "--output_dir", str(folder)], env, output_dir)
        outputs = sorted(str(path.relative_to(output_dir)) for path in folder.glob("*") if path.is_file())
        summary["benchmarks"][bench] = {**step, "device": "cpu", "outputs": outputs}
    summary["seconds"] = round(time.perf_counter() - start, 1)
    summary["ok"] = (summary["tests"]["returncode"] == 0 and summary["tests"]["passed"] > 0
                     and all(step["returncode"] == 0 for step in summary["benchmarks"].values()))
    (output_dir / SUMMARY_FILE).write_text(json.dumps(summary, indent=2) + "\n")
    counts = summary["tests"]
    print(f"{'ok' if summary['ok'] else 'FAILED'}: {counts['passed']} tests passed, {counts['failed']} failed, "
          f"{counts['errors']} errors, {counts['skipped']} skipped on {args.device} ({summary['device_name']}); "
          f"benchmarks (CPU) in {output_dir}; {summary['seconds']:.0f} s; summary: {output_dir / SUMMARY_FILE}")
    return 0 if summary["ok"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
