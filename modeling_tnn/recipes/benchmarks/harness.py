"""The one harness behind every benchmark number: the timing loop of :mod:`..common.timing` (interleaved rounds over
the variants being compared, medians and spread, a warm-up; its names are importable from here), one torch thread by
default, and a record of the machine and of the source tree; it writes ``results.json`` (with the exact command
line), ``table.md`` and a PNG into one folder per benchmark.

Nothing else in the project keeps a timing loop: the benchmarks build :class:`Workload` objects and hand them to
:func:`interleaved` (or :func:`time_once` for a single event such as a one-off fit).
"""

from __future__ import annotations

import json
import os
import platform
import shlex
import subprocess
import sys
from collections.abc import Callable, Hashable, Mapping, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch

# The timing loop lives in common (pretraining's --time_generation uses it too); the benchmarks import it from here.
from ..common.timing import (  # noqa: F401 (re-exported)
    CLOCK,
    DECODE_TOKENS,
    Clock,
    StreamerClock,
    Timing,
    Workload,
    consecutive,
    interleaved,
    interleaved_samples,
    run_round,
    time_once,
    workload,
)

RESULTS_FILE = "results.json"
TABLE_FILE = "table.md"


def set_threads(threads: int = 1) -> int:
    """Set torch's intra-op threads (one by default: the benchmarks compare algorithms, not thread scaling)."""
    if threads < 1:
        raise ValueError(f"threads must be at least 1, got {threads}.")
    torch.set_num_threads(threads)
    return torch.get_num_threads()


# -- what a result is measured on ----------------------------------------------------------------------------------


def source_tree() -> Path:
    """The checkout the model code is imported from (where ``modeling_tnn`` lives)."""
    import modeling_tnn

    return Path(modeling_tnn.__file__).resolve().parents[1]


def env_with_package() -> dict[str, str]:
    """This process's environment with :func:`source_tree` first on ``PYTHONPATH``, so that a benchmark's
    ``python -m`` subprocess (a fresh process per measurement) runs the same code as this process."""
    paths = [str(source_tree()), os.environ.get("PYTHONPATH", "")]
    return dict(os.environ, PYTHONPATH=os.pathsep.join(dict.fromkeys(p for p in paths if p)))


def status_kb(field: str) -> int:
    """One kB field of this process's ``/proc/self/status`` (Linux): ``VmRSS`` the resident set, ``VmHWM`` its
    high-water mark; RuntimeError where the file lacks the field."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {field}")


def source_state(root: Path | None = None) -> dict[str, Any]:
    """The git commit of ``root`` (default: :func:`source_tree`) and whether its tree differs from it (results/
    left out: a benchmark run writes there). ``commit`` is None outside a git checkout."""
    root = source_tree() if root is None else root

    def git(*args: str) -> str | None:
        try:
            done = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            return None
        return done.stdout.strip() if done.returncode == 0 else None

    commit = git("rev-parse", "HEAD")
    changes = git("status", "--porcelain", "--", ".", ":(exclude)results") if commit else None
    # No path: a committed record names no machine's folders.
    return dict(commit=commit, dirty=None if changes is None else bool(changes))


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo`` on Linux, else what ``platform`` says)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith(("model name", "hardware")):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine() -> dict[str, Any]:
    """The machine a result was measured on: CPU, cores (all and usable by this process), torch threads, versions,
    the load average when asked."""
    import transformers

    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return dict(cpu=cpu_model(), cores=os.cpu_count(), usable_cores=usable, torch_threads=torch.get_num_threads(),
                torch=torch.__version__, transformers=transformers.__version__, python=platform.python_version(),
                platform=platform.platform(), load_average=list(os.getloadavg()) if hasattr(os, "getloadavg")
                else None)


def command_line(script: str, argv: Sequence[str] | None = None) -> str:
    """The exact command that reproduces a run: ``python <script> <argv>`` (argv: this process's by default)."""
    return shlex.join(["python", script, *(sys.argv[1:] if argv is None else argv)])


# -- one folder per benchmark --------------------------------------------------------------------------------------


def timing_rows(timings: Mapping[Hashable, Timing]) -> dict[str, dict[str, Any]]:
    """``{label: Timing.summary()}`` with each key as a label (tuples joined by spaces)."""
    return {label_of(key): timing.summary() for key, timing in timings.items()}


def label_of(key: Hashable) -> str:
    return " ".join(map(str, key)) if isinstance(key, tuple) else str(key)


def pyplot():
    """matplotlib's pyplot on the file-only Agg backend (benchmarks draw PNGs, never windows)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig, path: Path, dpi: int = 110) -> None:
    """Lay out, write and close a figure."""
    fig.tight_layout()
    fig.savefig(path, dpi=dpi)
    pyplot().close(fig)


def plot_timings(timings: Mapping[Hashable, Timing], path: Path, title: str) -> None:
    """The default figure: each variant's median with its interquartile range."""
    plt = pyplot()

    labels = [label_of(key) for key in timings]
    medians = [t.median * 1e3 for t in timings.values()]
    low = [(t.median - t.quartiles()[0]) * 1e3 for t in timings.values()]
    high = [(t.quartiles()[1] - t.median) * 1e3 for t in timings.values()]
    fig, ax = plt.subplots(figsize=(max(5.0, 0.6 * len(labels) + 2), 4))
    ax.bar(range(len(labels)), medians, yerr=[low, high], capsize=3)
    ax.set_xticks(range(len(labels)), labels, rotation=45, ha="right", fontsize=8)
    ax.set_ylabel("ms (median, bars: interquartile range)")
    ax.set_title(title)
    ax.grid(True, axis="y", alpha=0.3)
    save_figure(fig, path)


def write_report(folder: Path | str, benchmark: str, command: str, settings: Mapping[str, Any], results: Any,
                 table: str, figure: str = "figure.png", plot: Callable[[Path], None] | None = None,
                 timings: Mapping[Hashable, Timing] | None = None, started: float | None = None) -> Path:
    """Write one benchmark's folder: ``results.json`` (benchmark, command, source commit and dirtiness, machine,
    settings, results), ``table.md`` (``table`` with a header naming the command, commit and machine) and the PNG
    ``figure``, drawn by ``plot(path)`` or, without it, :func:`plot_timings` of ``timings``. Returns the folder."""
    if plot is None and timings is None:
        raise ValueError(f"write_report({benchmark!r}): a plot callable or timings to draw are needed.")
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    source, host = source_state(), machine()
    record = dict(benchmark=benchmark, command=command, source=source, machine=host, settings=dict(settings),
                  finished=datetime.now(timezone.utc).isoformat(timespec="seconds"),
                  wall_seconds=None if started is None else round(CLOCK() - started, 1), results=results)
    (folder / RESULTS_FILE).write_text(json.dumps(record, indent=1, default=str) + "\n")
    commit = (source["commit"] or "no git commit")[:12] + (" (tree with uncommitted changes)" if source["dirty"]
                                                            else "")
    header = (f"Command: `{command}`  \nCommit: {commit}; {host['cpu']}, {host['usable_cores']} usable of "
              f"{host['cores']} cores, {host['torch_threads']} torch thread(s), torch {host['torch']}, transformers "
              f"{host['transformers']}; {record['finished']}.")
    (folder / TABLE_FILE).write_text(f"# {benchmark}\n\n{header}\n\n{table.rstrip()}\n")
    if plot is not None:
        plot(folder / figure)
    else:
        plot_timings(timings, folder / figure, benchmark)
    return folder
