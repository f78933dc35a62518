"""Forward + backward time of the dense, FD and SKI token mixers, alone and inside one TNN block.

Every configuration is timed once per round and the rounds interleave, so a burst of load on a shared machine
hits all configurations alike; medians over rounds are reported, and ratios are taken within this one run.

    python run_scripts/bench_token_mixers.py --output_dir results/bench_token_mixers

``--direct`` times instead the dense and FD mixers' two paths against each other at short lengths (the
product with each channel's Toeplitz matrix, and the FFT), at a fixed number of tokens per step, which is what
the library's direct-path limits are set from (the path forced through :func:`.policies.forced_convolution_path`):

    python run_scripts/bench_token_mixers.py --direct --threads 1 --output_dir results/bench_token_mixers_direct
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from modeling_tnn import load_preset
from modeling_tnn.tnn_block import TnnBlock, build_token_mixer

from .harness import (
    CLOCK,
    command_line,
    interleaved,
    pyplot,
    save_figure,
    set_threads,
    workload,
    write_report,
)
from .policies import forced_convolution_path

SCRIPT = "run_scripts/bench_token_mixers.py"
CASES = [("dense", False), ("fd", False), ("ski", False), ("dense", True), ("fd", True)]


def config_for(mixer: str, causal: bool, channels: int):
    # hidden_size 16 with a 24x GTU expansion: 384 mixer channels, so the block's cost is the mixer's.
    return load_preset("wikitext103_lm", token_mixer=mixer, causal=causal, hidden_size=16,
                       gtu_expand_ratio=channels / 16, glu_expand_ratio=1, dropout=0.0, num_hidden_layers=1)


def make_step(kind: str, mixer: str, causal: bool, n: int, batch: int, channels: int):
    """A closure running one forward + backward of the measured module."""
    if kind == "floor":
        # What any FFT mixer pays at least: rfft + irfft of the input at the dense FFT size, forward and backward
        # (the convolution with a unit impulse, through the same code path as the mixers, no kernel gradient).
        from modeling_tnn.ops_dispatch import current_policy
        from modeling_tnn.ops_fft_convolution import fft_convolve
        from modeling_tnn.ops_fft_sizes import fft_length

        x = torch.randn(batch, n, channels, requires_grad=True)
        fft_len = fft_length(n)
        impulse = torch.ones(fft_len // 2 + 1, channels, dtype=torch.complex64)
        # The recompute choice and channel chunks the dispatcher would give this input (it sizes them per call).
        policy = current_policy()
        recompute = policy.recomputes(batch * (fft_len // 2 + 1) * channels * 8, None)

        def step():
            fft_convolve(x, impulse, fft_len, recompute=recompute,
                         chunk_elements=policy.chunk_budget(x.device)).sum().backward()
        return step
    config = config_for(mixer, causal, channels)
    if kind == "mixer":
        module = build_token_mixer(config, channels)
        x = torch.randn(batch, n, channels, requires_grad=True)
    else:
        module = TnnBlock(config, 0)
        x = torch.randn(batch, n, config.hidden_size, requires_grad=True)
    module.train()

    def step():
        module(x).sum().backward()
    return step


def run(lengths: list[int], batches: list[int], channels: int, rounds: int) -> list[dict]:
    jobs = []
    for n in lengths:
        for batch in batches:
            jobs.append(dict(kind="floor", mixer="rfft+irfft", causal=None, n=n, batch=batch))
            for kind in ("mixer", "block"):
                for mixer, causal in CASES:
                    jobs.append(dict(kind=kind, mixer=mixer, causal=causal, n=n, batch=batch))
    steps = {i: workload(make_step(job["kind"], job["mixer"], job["causal"], job["n"], job["batch"], channels))
             for i, job in enumerate(jobs)}
    timings = interleaved(steps, rounds=rounds, warmup=1, progress="token mixers")
    return [dict(job, median_ms=1000 * timings[i].median, spread=timings[i].spread,
                 times_ms=[1000 * v for v in timings[i].samples]) for i, job in enumerate(jobs)]


def lookup(results, **key) -> float:
    return next(r["median_ms"] for r in results if all(r[k] == v for k, v in key.items()))


def ratio_table(results: list[dict], lengths: list[int], batches: list[int]) -> str:
    lines = ["| level | batch | n | dense bi (ms) | fd bi | ski | dense causal (ms) | fd causal | floor (ms) |",
             "|---|---|---|---|---|---|---|---|---|"]
    for kind in ("mixer", "block"):
        for batch in batches:
            for n in lengths:
                dense_bi = lookup(results, kind=kind, mixer="dense", causal=False, n=n, batch=batch)
                dense_c = lookup(results, kind=kind, mixer="dense", causal=True, n=n, batch=batch)
                fd_bi = lookup(results, kind=kind, mixer="fd", causal=False, n=n, batch=batch)
                ski = lookup(results, kind=kind, mixer="ski", causal=False, n=n, batch=batch)
                fd_c = lookup(results, kind=kind, mixer="fd", causal=True, n=n, batch=batch)
                floor = lookup(results, kind="floor", n=n, batch=batch)
                lines.append(f"| {kind} | {batch} | {n} | {dense_bi:.1f} | {dense_bi / fd_bi:.2f}x | "
                             f"{dense_bi / ski:.2f}x | {dense_c:.1f} | {dense_c / fd_c:.2f}x | {floor:.1f} |")
    return "\n".join(lines)


def targets(results: list[dict], lengths: list[int], batches: list[int]) -> list[dict]:
    """The issue's targets, each checked at every level and batch measured: SKI vs dense (bidirectional) at
    n = 8192 (3x) and 16384 (4x), SKI's time growth from 4096 to 16384 (at most 5x), FD vs dense of the same
    direction at every n (bidirectional 1.25x, causal 1x)."""
    checks = []

    def ratio(kind, batch, n, mixer, causal):
        return lookup(results, kind=kind, mixer="dense", causal=causal, n=n, batch=batch) / lookup(
            results, kind=kind, mixer=mixer, causal=causal, n=n, batch=batch)

    for kind in ("mixer", "block"):
        for batch in batches:
            where = dict(level=kind, batch=batch)
            for n, goal in ((8192, 3.0), (16384, 4.0)):
                if n in lengths:
                    value = ratio(kind, batch, n, "ski", False)
                    checks.append(dict(where, target=f"SKI vs dense at n={n} >= {goal}x", value=value,
                                       met=value >= goal))
            if {4096, 16384} <= set(lengths):
                value = lookup(results, kind=kind, mixer="ski", causal=False, n=16384, batch=batch) / lookup(
                    results, kind=kind, mixer="ski", causal=False, n=4096, batch=batch)
                checks.append(dict(where, target="SKI t(16384)/t(4096) <= 5", value=value, met=value <= 5))
            for causal, goal in ((False, 1.25), (True, 1.0)):
                values = {n: ratio(kind, batch, n, "fd", causal) for n in lengths}
                worst = min(values, key=values.get)
                checks.append(dict(where, target=f"FD {'causal' if causal else 'bidirectional'} vs dense >= "
                                                 f"{goal}x at every n", value=values[worst], worst_n=worst,
                                   missed_at=[n for n, v in values.items() if v < goal],
                                   met=all(v >= goal for v in values.values())))
    return checks


def targets_table(checks: list[dict]) -> str:
    lines = ["| target | level | batch | value | met |", "|---|---|---|---|---|"]
    for c in checks:
        detail = f" (worst at n={c['worst_n']}; below at n={c['missed_at']})" if c.get("missed_at") else ""
        lines.append(f"| {c['target']} | {c['level']} | {c['batch']} | {c['value']:.2f}{detail} | "
                     f"{'yes' if c['met'] else '**no**'} |")
    return "\n".join(lines)


def _style(ax, ylabel: str, title: str) -> None:
    """Axes over the sequence length (log 2), labelled, gridded, with a legend."""
    ax.set_xscale("log", base=2)
    ax.set_xlabel("sequence length n")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)


def plot(results: list[dict], lengths: list[int], batches: list[int], path: Path) -> None:
    plt = pyplot()

    fig, axes = plt.subplots(2, len(batches), figsize=(6 * len(batches), 9), squeeze=False)
    for row, kind in enumerate(("mixer", "block")):
        for col, batch in enumerate(batches):
            ax = axes[row][col]
            for mixer, causal in CASES:
                ys = [lookup(results, kind=kind, mixer=mixer, causal=causal, n=n, batch=batch) for n in lengths]
                ax.plot(lengths, ys, marker="o", linestyle="-" if not causal else "--",
                        label=f"{mixer} {'causal' if causal else 'bidirectional'}")
            ys = [lookup(results, kind="floor", n=n, batch=batch) for n in lengths]
            ax.plot(lengths, ys, color="grey", linestyle=":", label="floor: rfft + irfft of the input")
            ax.set_yscale("log")
            _style(ax, "forward + backward (ms, median)",
                   f"{'token mixer alone' if kind == 'mixer' else 'one TNN block'}, batch {batch}")
    save_figure(fig, path)


DIRECT_CASES = [("dense", True), ("dense", False), ("fd", True), ("fd", False)]


def direct_run(lengths: list[int], channel_counts: list[int], tokens: int, rounds: int) -> list[dict]:
    """Forward + backward of each mixer alone on either path (forced by :func:`.policies.forced_convolution_path`),
    interleaved rounds."""
    jobs, steps = [], {}
    for channels in channel_counts:
        for n in lengths:
            batch = max(1, tokens // n)
            for mixer, causal in DIRECT_CASES:
                config = config_for(mixer, causal, channels)
                module = build_token_mixer(config, channels).train()
                x = torch.randn(batch, n, channels, requires_grad=True)
                for path in ("direct", "fft"):
                    jobs.append(dict(mixer=mixer, causal=causal, channels=channels, n=n, batch=batch, path=path))
                    steps[len(jobs) - 1] = workload(lambda path=path, module=module, x=x: _on_path(path, module, x))
    timings = interleaved(steps, rounds=rounds, warmup=1, progress="direct vs fft")
    return [dict(job, median_ms=1000 * timings[i].median, spread=timings[i].spread,
                 times_ms=[1000 * v for v in timings[i].samples]) for i, job in enumerate(jobs)]


def _on_path(path: str, module: torch.nn.Module, x: torch.Tensor) -> None:
    with forced_convolution_path(path):
        module(x).sum().backward()


def direct_table(results: list[dict], lengths: list[int], channel_counts: list[int]) -> str:
    lines = ["| channels | n | batch | " + " | ".join(f"{m} {'causal' if c else 'bi'} fft / direct"
                                                    for m, c in DIRECT_CASES) + " | direct ms (dense causal) |",
             "|---|---|---|" + "---|" * (len(DIRECT_CASES) + 1)]
    for channels in channel_counts:
        for n in lengths:
            cells = []
            for mixer, causal in DIRECT_CASES:
                key = dict(mixer=mixer, causal=causal, channels=channels, n=n)
                cells.append(f"{lookup(results, path='fft', **key) / lookup(results, path='direct', **key):.2f}x")
            direct_ms = lookup(results, path="direct", mixer="dense", causal=True, channels=channels, n=n)
            batch = next(r["batch"] for r in results if r["n"] == n)
            lines.append(f"| {channels} | {n} | {batch} | " + " | ".join(cells) + f" | {direct_ms:.2f} |")
    return "\n".join(lines)


def direct_main(args: argparse.Namespace, command: str, started: float) -> None:
    lengths = [int(v) for v in args.lengths.split(",")]
    channel_counts = [int(v) for v in args.channel_counts.split(",")]
    results = direct_run(lengths, channel_counts, args.tokens, args.rounds)
    table = direct_table(results, lengths, channel_counts)
    text = (f"Median of {args.rounds} interleaved rounds, {args.tokens} tokens per step. Forward + backward of the "
            "mixer alone: time of the FFT path over that of the direct product (above 1: the direct product is "
            "faster).\n\n" + table)
    print(table)
    write_report(args.output_dir, "token mixers: direct product against FFT", command, vars(args),
                 dict(results=results), text, figure="direct.png",
                 plot=lambda path: plot_direct(results, lengths, channel_counts, args.tokens, path), started=started)


def plot_direct(results: list[dict], lengths: list[int], channel_counts: list[int], tokens: int, path: Path) -> None:
    plt = pyplot()

    fig, axes = plt.subplots(1, len(channel_counts), figsize=(5 * len(channel_counts), 4), squeeze=False)
    for ax, channels in zip(axes[0], channel_counts):
        for mixer, causal in DIRECT_CASES:
            key = dict(mixer=mixer, causal=causal, channels=channels)
            ax.plot(lengths, [lookup(results, path="fft", n=n, **key) / lookup(results, path="direct", n=n, **key)
                              for n in lengths], marker="o", label=f"{mixer} {'causal' if causal else 'bi'}")
        ax.axhline(1, color="grey", linestyle=":")
        _style(ax, "FFT time / direct time", f"{channels} channels, {tokens} tokens per step")
    save_figure(fig, path)


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lengths", default="512,1024,2048,4096,8192,16384")
    parser.add_argument("--batches", default="1,4")
    parser.add_argument("--channels", type=int, default=384)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    parser.add_argument("--output_dir", default=None, help="default: results/bench_token_mixers (with --direct: "
                        "results/bench_token_mixers_direct)")
    parser.add_argument("--direct", action="store_true", help="time the short-sequence path against the FFT")
    parser.add_argument("--channel_counts", default="128,384,768", help="--direct: mixer widths")
    parser.add_argument("--tokens", type=int, default=8192, help="--direct: tokens per step (batch = tokens // n)")
    args = parser.parse_args(argv)
    args.output_dir = args.output_dir or ("results/bench_token_mixers_direct" if args.direct
                                          else "results/bench_token_mixers")
    started = CLOCK()
    set_threads(args.threads)
    command = command_line(SCRIPT, argv)
    torch.manual_seed(0)
    if args.direct:
        direct_main(args, command, started)
        return
    lengths = [int(v) for v in args.lengths.split(",")]
    batches = [int(v) for v in args.batches.split(",")]
    results = run(lengths, batches, args.channels, args.rounds)
    table = ratio_table(results, lengths, batches)
    growth = {f"ski_{kind}_b{b}_t16384_over_t4096": lookup(results, kind=kind, mixer="ski", causal=False, n=16384,
                                                           batch=b) /
              lookup(results, kind=kind, mixer="ski", causal=False, n=4096, batch=b)
              for kind in ("mixer", "block") for b in batches if {4096, 16384} <= set(lengths)}
    checks = targets(results, lengths, batches)
    text = (f"Median of {args.rounds} interleaved rounds, {args.channels} mixer channels. Speed-up over dense of the "
            "same direction (median forward + backward, higher is faster). The floor is rfft + irfft of the input "
            "at the dense FFT size, forward and backward.\n\n" + table + "\n\nTargets:\n\n" + targets_table(checks))
    print(text)
    print("SKI time growth t(16384)/t(4096):", {k: round(v, 2) for k, v in growth.items()})
    write_report(args.output_dir, "token mixers", command, vars(args),
                 dict(ski_growth=growth, targets=checks, results=results), text, figure="times.png",
                 plot=lambda path: plot(results, lengths, batches, path), started=started)


if __name__ == "__main__":
    main()
