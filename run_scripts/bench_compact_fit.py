#!/usr/bin/env python
"""Time of the compact decoding state's fit (modeling_tnn/decoding_modal_fit.py, once per set of weights) and the
plan it gives, for two models with random weights at their initialisation:

- ``benchmark``: bench_generation.py's benchmark model (the ``small`` preset at hidden 256, 4 layers, vocabulary
  8,192, ``decay_gamma`` 0.99; built by its ``tnn`` helper), 768 channels per layer;
- ``demo``: the model ``make demo`` trains (the ``small`` preset, vocabulary 2,048), 384 channels per layer.

Each run clears the mixers' memoised kernel constants and times what the first cached forward pays: the fit of
every layer plus a 2-token prefill (bench_generation.py's ``fit_time``); one thread, median of ``--runs``. The plan
(per layer: window, modes, largest certified bound) and the state per sequence (``memory_bytes()`` at batch 2
minus batch 1) come from the last run's cache.

    python run_scripts/bench_compact_fit.py --output_dir results/bench_compact_fit
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import torch
from bench_generation import fit_time, tnn

from modeling_tnn import TnnForCausalLM, load_preset
from modeling_tnn.modeling_tnn import CACHE_FIELD
from modeling_tnn.tno_dense import DenseTno


def benchmark_model() -> TnnForCausalLM:
    """bench_generation.py's dense model at its default arguments."""
    defaults = argparse.Namespace(hidden_size=256, num_layers=4, vocab_size=8192, etsc_length=512, decay_gamma=0.99)
    return tnn(defaults, "dense")


def demo_model() -> TnnForCausalLM:
    """The model ``make demo`` trains (``--config_name small --vocab_size 2048``), at its initialisation."""
    return TnnForCausalLM(load_preset("small", vocab_size=2048, dropout=0.0)).eval()


def clear_fits(model: TnnForCausalLM) -> None:
    """Forget every mixer's memoised kernel constants (the compact fit among them)."""
    for module in model.modules():
        if isinstance(module, DenseTno):
            module._eval_cache.clear()


def measure(name: str, model: TnnForCausalLM, runs: int) -> dict:
    seconds = []
    for _ in range(runs):
        clear_fits(model)
        seconds.append(fit_time(model))
    states = []
    with torch.no_grad():
        for batch in (1, 2):
            out = model(input_ids=torch.ones(batch, 2, dtype=torch.long), use_cache=True)
            states.append(getattr(out, CACHE_FIELD).memory_bytes())
        layers = getattr(out, CACHE_FIELD).describe()
    channels = next(m for m in model.modules() if isinstance(m, DenseTno)).rpe.out_proj.out_features
    return dict(model=name, channels_per_layer=channels, layers=len(layers), fit_seconds=seconds,
                fit_seconds_median=statistics.median(seconds), state_bytes_per_sequence=states[1] - states[0],
                max_error_bound=max(row["error_bound"] or 0.0 for row in layers),
                tolerance=model.config.compact_tolerance,
                plan=[{key: row[key] for key in ("plan", "window", "modes", "error_bound")} for row in layers])


def render(results: list[dict]) -> str:
    lines = ["| model | channels x layers | fit, median (s) | runs (s) | plan per layer (window + modes) | "
             "largest bound | state per sequence (bytes) |", "|---|---|---|---|---|---|---|"]
    for r in results:
        plan = ", ".join(f"{row['window']}+{row['modes']}" if row["plan"] == "compact" else row["plan"]
                         for row in r["plan"])
        runs = " / ".join(f"{s:.1f}" for s in r["fit_seconds"])
        lines.append(f"| {r['model']} | {r['channels_per_layer']} x {r['layers']} | {r['fit_seconds_median']:.1f} | "
                     f"{runs} | {plan} | {r['max_error_bound']:.1e} | {r['state_bytes_per_sequence']:,} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3, help="fits timed per model (median reported)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--output_dir", default="results/bench_compact_fit")
    args = parser.parse_args()
    if args.runs < 1:
        raise ValueError(f"--runs must be at least 1, got {args.runs}.")
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    results = [measure("benchmark", benchmark_model(), args.runs), measure("demo", demo_model(), args.runs)]
    out = Path(args.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    meta = dict(command="python run_scripts/bench_compact_fit.py " + " ".join(
        f"--{k} {v}" for k, v in vars(args).items()), torch=torch.__version__, threads=torch.get_num_threads())
    (out / "results.json").write_text(json.dumps(dict(meta=meta, results=results), indent=1))
    table = render(results)
    (out / "table.md").write_text(table + "\n")
    print(table)
    print(f"wrote {out}/results.json, table.md")


if __name__ == "__main__":
    main()
