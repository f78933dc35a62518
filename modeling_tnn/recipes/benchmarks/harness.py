"""The one timing harness behind every benchmark number: interleaved rounds over the variants being compared,
medians and spread, a warm-up, one torch thread by default, and a record of the machine and of the source tree; it
writes ``results.json`` (with the exact command line), ``table.md`` and a PNG into one folder per benchmark.

Why interleaved rounds: on a shared machine the load changes over minutes. Each round runs every variant once, so a
burst of load hits all of them alike; the median over rounds drops the rounds a burst spoiled, and ratios taken
within one run compare variants that saw the same machine.

Nothing else in the project keeps a timing loop: the benchmarks build :class:`Workload` objects and hand them to
:func:`interleaved` (or :func:`time_once` for a single event such as a one-off fit).
"""

from __future__ import annotations

import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch

Clock = Callable[[], float]
# The clock every measurement reads: monotonic, the highest resolution the platform has.
CLOCK: Clock = time.perf_counter
RESULTS_FILE = "results.json"
TABLE_FILE = "table.md"


@dataclass(frozen=True)
class Workload:
    """What one round runs for one variant: ``phases`` timed back to back (the variant's sample is their sum, and
    each phase's own time is kept under its name), after an untimed ``before`` (e.g. a decode step that puts the
    caches where the timed one will find them)."""

    phases: tuple[Callable[[], object], ...]
    names: tuple[str, ...] = ()
    before: Callable[[], object] | None = None

    def __post_init__(self) -> None:
        if not self.phases:
            raise ValueError("Workload.phases: at least one callable is needed.")
        if self.names and len(self.names) != len(self.phases):
            raise ValueError(f"Workload.names: one name per phase ({len(self.phases)}), got {list(self.names)}.")


def workload(*phases: Callable[[], object], names: Sequence[str] = (), before: Callable[[], object] | None = None
             ) -> Workload:
    """A :class:`Workload` of ``phases`` (one callable: a single timed call)."""
    return Workload(tuple(phases), tuple(names), before)


@dataclass
class Timing:
    """The samples of one variant, in round order (seconds), and those of each named phase."""

    samples: list[float] = field(default_factory=list)
    phases: dict[str, list[float]] = field(default_factory=dict)

    @property
    def median(self) -> float:
        return statistics.median(self.samples)

    def quartiles(self) -> tuple[float, float]:
        """The first and third quartile (both the single sample when there is one)."""
        if len(self.samples) < 2:
            return self.samples[0], self.samples[0]
        q = statistics.quantiles(self.samples, n=4, method="inclusive")
        return q[0], q[2]

    @property
    def spread(self) -> float:
        """The interquartile range over the median: the relative scatter of the rounds."""
        q1, q3 = self.quartiles()
        return (q3 - q1) / self.median if self.median else 0.0

    def summary(self) -> dict[str, Any]:
        """The JSON form: median, quartiles, relative spread, min, max, every sample, and each phase's median."""
        q1, q3 = self.quartiles()
        out = dict(median_s=self.median, q1_s=q1, q3_s=q3, spread=self.spread, min_s=min(self.samples),
                   max_s=max(self.samples), rounds=len(self.samples), samples_s=list(self.samples))
        for name, values in self.phases.items():
            out[f"{name}_median_s"] = statistics.median(values)
        return out


def run_round(workloads: Mapping[Hashable, Workload], clock: Clock = CLOCK,
              order: Sequence[Hashable] | None = None) -> dict[Hashable, list[float]]:
    """One round: every workload once (in ``order``, default the mapping's), its ``before`` untimed, then its phases
    timed back to back. Returns each workload's phase times."""
    times = {}
    for key in order if order is not None else list(workloads):
        work = workloads[key]
        if work.before is not None:
            work.before()
        marks = [clock()]
        for phase in work.phases:
            phase()
            marks.append(clock())
        times[key] = [b - a for a, b in zip(marks, marks[1:])]
    return times


def interleaved(workloads: Mapping[Hashable, Workload], rounds: int, warmup: int = 1, clock: Clock = CLOCK,
                rotate: bool = False, progress: str | None = None) -> dict[Hashable, Timing]:
    """Time ``workloads`` over ``rounds`` interleaved rounds after ``warmup`` untimed ones (allocator, optimizer
    state, FFT plans, compilation). With ``rotate`` the order shifts by one each round, so no variant always runs
    after the same neighbour. ``progress`` names the run in a line printed per round."""
    if rounds < 1:
        raise ValueError(f"rounds must be at least 1, got {rounds}.")
    if warmup < 0:
        raise ValueError(f"warmup must be at least 0, got {warmup}.")
    keys = list(workloads)
    for _ in range(warmup):
        run_round(workloads, clock)
    timings = {key: Timing() for key in keys}
    for index in range(rounds):
        shift = index % len(keys) if rotate and keys else 0
        for key, phase_times in run_round(workloads, clock, keys[shift:] + keys[:shift]).items():
            timings[key].samples.append(sum(phase_times))
            for name, value in zip(workloads[key].names, phase_times):
                timings[key].phases.setdefault(name, []).append(value)
        if progress:
            print(f"{progress}: round {index + 1}/{rounds}", flush=True)
    return timings


def interleaved_samples(samplers: Mapping[Hashable, Callable[[], float]], rounds: int, warmup: int = 0,
                        progress: str | None = None) -> dict[Hashable, Timing]:
    """Interleaved rounds of measurements a workload takes itself (each call returns its seconds, e.g. the
    :class:`StreamerClock` of a ``generate`` call): every sampler once per round, after ``warmup`` discarded
    rounds."""
    if rounds < 1:
        raise ValueError(f"rounds must be at least 1, got {rounds}.")
    timings = {key: Timing() for key in samplers}
    for index in range(warmup + rounds):
        for key, sample in samplers.items():
            value = sample()
            if index >= warmup:
                timings[key].samples.append(value)
        if progress and index >= warmup:
            print(f"{progress}: round {index - warmup + 1}/{rounds}", flush=True)
    return timings


def time_once(function: Callable[[], Any], clock: Clock = CLOCK) -> tuple[Any, float]:
    """``(function(), seconds it took)``: for an event that happens once (a fit, a profiled step)."""
    start = clock()
    result = function()
    return result, clock() - start


class StreamerClock:
    """A ``generate`` streamer (``put`` / ``end``) that reads the harness clock at every ``put``: the prompt first,
    then each new token. Times the tokens of a real ``generate`` call where a step loop cannot."""

    def __init__(self, clock: Clock = CLOCK):
        self.clock = clock
        self.times: list[float] = []

    def put(self, value: Any) -> None:
        self.times.append(self.clock())

    def end(self) -> None:
        pass

    def token_seconds(self) -> float:
        """Median interval between new tokens after the first (put 0 is the prompt, put 1 follows the prefill)."""
        new_tokens = self.times[1:]
        if len(new_tokens) < 2:
            raise ValueError(f"StreamerClock: at least 2 new tokens are needed, got {len(new_tokens)}.")
        return statistics.median(b - a for a, b in zip(new_tokens, new_tokens[1:]))


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
