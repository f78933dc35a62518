"""Whether FD kernels compress like decaying dense ones: the compact plan's fit applied to the causal FD kernel of
the decoding benchmark's FD model (layer 0), its relative l1 error over 4,096 lags per channel, for a few (window,
realisation rank) pairs.

    python run_scripts/bench_fd_compression.py --output_dir results/bench_fd_compression
"""

from __future__ import annotations

import argparse
import sys

import torch

from modeling_tnn import TnnForCausalLM, load_preset
from modeling_tnn.fit_modal import fit_residues, hankel_poles, modal_taps

from .harness import CLOCK, command_line, pyplot, save_figure, set_threads, write_report

SCRIPT = "run_scripts/bench_fd_compression.py"
LAGS = 4096
FITS = ((32, 32), (32, 64), (64, 96), (128, 128))  # (window, realisation rank)


def measure() -> dict:
    """The kernel's support and, per fit, its modes and the max / median relative l1 error over the channels."""
    config = load_preset("small", token_mixer="fd", hidden_size=256, num_hidden_layers=4, vocab_size=8192,
                         dropout=0.0, etsc_length=512, fd_kernel_length=512)
    mixer = TnnForCausalLM(config).eval().model.layers[0].gtu.token_mixer
    with torch.no_grad():
        taps = mixer.causal_taps(LAGS, torch.device("cpu")).double()
    l1 = taps.abs().sum(0)
    rows = []
    for window, rank in FITS:
        samples = taps[window:].t().contiguous()
        poles, used = hankel_poles(samples[:, :1000], rank)
        residues = fit_residues(samples, poles, used)
        error = (modal_taps(poles, residues, torch.arange(LAGS - window)) - taps[window:]).abs().sum(0) / l1
        rows.append(dict(window=window, rank=rank, modes=poles.shape[1], reals_per_channel=window + 2 * poles.shape[1],
                         max_relative_l1=error.max().item(), median_relative_l1=error.median().item()))
        print(rows[-1], flush=True)
    support = int((taps.abs().amax(1) > 0).nonzero().max()) + 1
    return dict(support=support, lags=LAGS, fits=rows)


def render(result: dict) -> str:
    lines = [f"FD kernel of layer 0: support {result['support']} lags; the compact fit over {result['lags']} lags.",
             "", "| window | rank | modes | reals per channel | max relative l1 | median relative l1 |",
             "|---|---|---|---|---|---|"]
    lines += [f"| {r['window']} | {r['rank']} | {r['modes']} | {r['reals_per_channel']} | {r['max_relative_l1']:.1e} "
              f"| {r['median_relative_l1']:.1e} |" for r in result["fits"]]
    return "\n".join(lines)


def plot(result: dict, path) -> None:
    plt = pyplot()

    fig, ax = plt.subplots(figsize=(5, 4))
    reals = [r["reals_per_channel"] for r in result["fits"]]
    ax.plot(reals, [r["max_relative_l1"] for r in result["fits"]], marker="o", label="max over channels")
    ax.plot(reals, [r["median_relative_l1"] for r in result["fits"]], marker="o", label="median")
    ax.set_xlabel("reals per channel (window + 2 x modes)")
    ax.set_ylabel("relative l1 error of the fit")
    ax.set_yscale("log")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    save_figure(fig, path)


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--output_dir", default="results/bench_fd_compression")
    args = parser.parse_args(argv)
    started = CLOCK()
    set_threads(1)
    torch.manual_seed(0)
    result = measure()
    table = render(result)
    print(table)
    write_report(args.output_dir, "FD kernel compression", command_line(SCRIPT, argv), vars(args), result, table,
                 figure="compression.png", plot=lambda path: plot(result, path), started=started)


if __name__ == "__main__":
    main()
