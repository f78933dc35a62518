"""The timing loop every measured number in the project goes through: interleaved rounds over the variants being
compared, after a warm-up, with medians and spread (the benchmarks' harness, :mod:`..benchmarks.harness`, adds the
machine record and the reports; ``train_clm.py --time_generation`` uses it directly).

Why interleaved rounds: on a shared machine the load changes over minutes. Each round runs every variant once, so a
burst of load hits all of them alike; the median over rounds drops the rounds a burst spoiled, and ratios taken
within one run compare variants that saw the same machine.

Nothing else in the project keeps a timing loop: callers build :class:`Workload` objects and hand them to
:func:`interleaved` (or :func:`time_once` for a single event such as a one-off fit).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

Clock = Callable[[], float]
# The clock every measurement reads: monotonic, the highest resolution the platform has.
CLOCK: Clock = time.perf_counter


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


# Consecutive decode steps per timed call: a whole fold period of the compact state (decoding_compact.FOLD_EVERY).
DECODE_TOKENS = 16


def consecutive(step: Callable[[], object], count: int) -> Callable[[], None]:
    """``step`` called ``count`` times in a row, as one timed call. A decode step is timed over a run of tokens, not
    one token: the compact state folds every K tokens (decoding_compact.FOLD_EVERY), and the median of single steps
    would leave the folding ones out."""
    def run() -> None:
        for _ in range(count):
            step()
    return run


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

    def per(self, count: int) -> Timing:
        """The samples (and phases) divided by ``count``: per token, where each timed call ran ``count`` tokens."""
        return Timing([s / count for s in self.samples],
                      {name: [v / count for v in values] for name, values in self.phases.items()})

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
        """Mean interval between new tokens after the first (put 0 is the prompt, put 1 follows the prefill): every
        step counted, a compact state's fold (one step in 16) among them, which a median of intervals leaves out."""
        new_tokens = self.times[1:]
        if len(new_tokens) < 2:
            raise ValueError(f"StreamerClock: at least 2 new tokens are needed, got {len(new_tokens)}.")
        return (new_tokens[-1] - new_tokens[0]) / (len(new_tokens) - 1)
