"""What a small operator costs on this machine right after another and after a pause: the machine's share of what a
decode step spends beyond its Linear calls (bench_decode_floor), measured without a model.

A decode step at batch 1 runs each of its small operators (the norms, the gating, the decoding state's update) once
or twice per layer, milliseconds apart. Where a core's caches and branch predictors are shared (a virtual machine's
neighbours, the host's interrupts), code and data not used for a while are cold when they run again, whatever the
model does in between. This benchmark separates that from the model: for each pause it busy-waits that long (the core
kept busy, no memory traffic of its own) between two calls of a small operator and times the second; the pauses take
turns within each round, and each cell is the median over the rounds.

    python run_scripts/bench_pause_penalty.py --output_dir results/bench_pause_penalty
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

import numpy as np
import torch

from ...rpe import SimpleRMSNorm
from .harness import CLOCK, command_line, interleaved_samples, pyplot, save_figure, set_threads, write_report

SCRIPT = "run_scripts/bench_pause_penalty.py"
WIDTH = 512  # a row of the 48.7M preset's residual stream


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pauses_ms", default="0,0.5,1,2,5,10",
                        help="comma list of busy-wait pauses before each timed call, in ms (default: %(default)s)")
    parser.add_argument("--rounds", type=int, default=100, help="interleaved rounds (each times every cell once)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--output_dir", default="results/bench_pause_penalty")
    args = parser.parse_args(argv)
    try:
        args.pauses_ms = [float(value) for value in args.pauses_ms.split(",") if value.strip()]
    except ValueError:
        raise ValueError(f"--pauses_ms must be a comma list of numbers, got {args.pauses_ms!r}.") from None
    if not args.pauses_ms or min(args.pauses_ms) < 0:
        raise ValueError(f"--pauses_ms must list at least one pause, none negative; got {args.pauses_ms}.")
    if args.rounds < 1:
        raise ValueError(f"--rounds must be at least 1, got {args.rounds}.")
    return args


def probes() -> dict[str, Callable[[], object]]:
    """The small operators timed: an add of two rows in torch and in numpy (not torch's dispatcher alone), and TNN's
    norm module on a row (three operators and a module call, as in a decode step; timed under ``no_grad``)."""
    x, y = torch.randn(1, 1, WIDTH), torch.randn(1, 1, WIDTH)
    a, b = x.numpy(), y.numpy()
    norm = SimpleRMSNorm()
    return {f"torch add ({WIDTH} floats)": lambda: torch.add(x, y),
            f"numpy add ({WIDTH} floats)": lambda: np.add(a, b),
            f"TNN norm ({WIDTH} floats)": lambda: norm(x)}


def after_pause(operator: Callable[[], object], pause_s: float) -> Callable[[], float]:
    """A sampler: one untimed call of ``operator``, a busy-wait of ``pause_s`` seconds, then the seconds of one more
    call: the time since the same operator last ran is the pause."""
    def sample() -> float:
        operator()
        until = CLOCK() + pause_s
        while CLOCK() < until:
            pass
        start = CLOCK()
        operator()
        return CLOCK() - start
    return sample


def measure(args) -> list[dict]:
    """Per probe: the median and quartiles (us) of one call after each pause."""
    operators = probes()
    samplers = {(name, pause): after_pause(operator, pause / 1e3)
                for name, operator in operators.items() for pause in args.pauses_ms}
    with torch.no_grad():  # as generate runs a decode step
        timings = interleaved_samples(samplers, rounds=args.rounds, warmup=1, progress="pause penalty")
    rows = []
    for name in operators:
        cells = {}
        for pause in args.pauses_ms:
            q1, q3 = timings[name, pause].quartiles()
            cells[pause] = dict(median_us=timings[name, pause].median * 1e6, q1_us=q1 * 1e6, q3_us=q3 * 1e6)
        rows.append(dict(probe=name, pauses=cells))
    return rows


def table(rows: list[dict], pauses: list[float]) -> str:
    lines = ["| operator | " + " | ".join(f"after {pause:g} ms" for pause in pauses) + " |",
             "|---|" + "---|" * len(pauses)]
    for row in rows:
        cells = [row["pauses"][pause] for pause in pauses]
        lines.append(f"| {row['probe']} | " + " | ".join(
            f"{cell['median_us']:.1f} ({cell['q1_us']:.1f}-{cell['q3_us']:.1f})" for cell in cells) + " |")
    return ("Microseconds of a call of a small operator that last ran the column's pause before (a busy-wait in "
            "between; 0: back to back), median (and quartiles) over interleaved rounds; one torch thread.\n\n"
            + "\n".join(lines) + "\n")


def plot(rows: list[dict], pauses: list[float], path) -> None:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4))
    for row in rows:
        cells = [row["pauses"][pause] for pause in pauses]
        ax.plot(pauses, [cell["median_us"] for cell in cells], marker="o", label=row["probe"])
        ax.fill_between(pauses, [cell["q1_us"] for cell in cells], [cell["q3_us"] for cell in cells], alpha=0.2)
    ax.set_xlabel("busy-wait since the same operator's last call (ms)")
    ax.set_ylabel("one call (us; median, band: quartiles)")
    ax.set_title("A small operator after a pause")
    ax.grid(True, alpha=0.3)
    ax.legend(frameon=False)
    save_figure(fig, path)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    started = CLOCK()
    set_threads(args.threads)
    rows = measure(args)
    for row in rows:
        cells = row["pauses"]
        print(f"{row['probe']}: " + ", ".join(f"{cells[pause]['median_us']:.1f} us after {pause:g} ms"
                                              for pause in args.pauses_ms))
    settings = {key: value for key, value in vars(args).items() if key != "output_dir"}
    write_report(args.output_dir, "bench_pause_penalty", command_line(SCRIPT, argv), settings, rows,
                 table(rows, args.pauses_ms), plot=lambda path: plot(rows, args.pauses_ms, path), started=started)
