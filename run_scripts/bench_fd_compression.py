#!/usr/bin/env python
"""Whether FD kernels compress like decaying dense ones: the compact plan's fit (modeling_tnn.decoding_modal_fit)
applied to the causal FD kernel of bench_generation's FD model (layer 0), its relative l1 error over 4,096 lags per channel.

    python run_scripts/bench_fd_compression.py --output results/bench_generation/fd_compression.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from modeling_tnn import TnnForCausalLM, load_preset
from modeling_tnn.decoding_modal_fit import fit_residues, hankel_poles, modal_taps

LAGS = 4096
FITS = ((32, 32), (32, 64), (64, 96), (128, 128))  # (window, realisation rank)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--output", default="results/bench_generation/fd_compression.json")
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
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
        rows.append(dict(window=window, modes=poles.shape[1], reals_per_channel=window + 2 * poles.shape[1],
                         max_relative_l1=error.max().item(), median_relative_l1=error.median().item()))
        print(rows[-1], flush=True)
    support = int((taps.abs().amax(1) > 0).nonzero().max()) + 1
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    Path(args.output).write_text(json.dumps(dict(support=support, fits=rows), indent=1))


if __name__ == "__main__":
    main()
