"""Time of the compact decoding state's fit (once per set of weights) and the plan it gives, for two models with
random weights at their initialisation:

- ``benchmark``: the decoding benchmark's model (:mod:`.generation`: the ``small`` preset at hidden 256, 4 layers,
  vocabulary 8,192, ``decay_gamma`` 0.99), 768 channels per layer;
- ``demo``: the model ``make demo`` trains (the ``small`` preset, vocabulary 2,048), 384 channels per layer.

Each round clears the mixers' memoised kernel constants (untimed) and times what the first cached forward pays: the
fit of every layer plus a 2-token prefill; the rounds interleave the two models; one thread, median of ``--runs``.
The plan (per layer: window, modes, largest certified bound) and the state per sequence (``memory_bytes()`` at batch
2 minus batch 1) come from a cache built after the rounds.

    python run_scripts/bench_compact_fit.py --output_dir results/bench_compact_fit
"""

from __future__ import annotations

import argparse
import sys

import torch

from modeling_tnn import TnnForCausalLM, load_preset
from modeling_tnn.mixer_base import TokenMixer
from modeling_tnn.modeling_tnn import CACHE_FIELD

from .generation import parse_args as generation_args
from .generation import tnn
from .harness import CLOCK, Timing, command_line, interleaved, set_threads, workload, write_report

SCRIPT = "run_scripts/bench_compact_fit.py"


def benchmark_model() -> TnnForCausalLM:
    """The decoding benchmark's dense model at its default arguments."""
    return tnn(generation_args([]), "dense")


def demo_model() -> TnnForCausalLM:
    """The model ``make demo`` trains (``--config_name small --vocab_size 2048``), at its initialisation."""
    return TnnForCausalLM(load_preset("small", vocab_size=2048, dropout=0.0)).eval()


def clear_fits(model: TnnForCausalLM) -> None:
    """Forget every mixer's memoised kernel constants, the compact fit among them: mixers memoise in eval mode
    through ``TokenMixer.cached`` (the fitted modal tail too, keyed by tolerance and device, in
    ``decoding_plan.modal_tail``), and ``TokenMixer.train`` drops that memo, in either mode."""
    mixers = [m for m in model.modules() if isinstance(m, TokenMixer)]
    if not mixers:
        raise RuntimeError("clear_fits: the model holds no TokenMixer: the mixers moved, update this benchmark.")
    for mixer in mixers:
        mixer.train(mixer.training)


def first_cached_forward(model: TnnForCausalLM) -> None:
    """What the first cached forward pays: the fit of every layer plus a 2-token prefill."""
    with torch.no_grad():
        model(input_ids=torch.ones(1, 2, dtype=torch.long), use_cache=True)


def describe(name: str, model: TnnForCausalLM, timing: Timing) -> dict:
    """The model's row: fit times, plan per layer, state bytes per sequence, largest certified bound."""
    states = []
    with torch.no_grad():
        for batch in (1, 2):
            out = model(input_ids=torch.ones(batch, 2, dtype=torch.long), use_cache=True)
            states.append(getattr(out, CACHE_FIELD).memory_bytes())
        layers = getattr(out, CACHE_FIELD).describe()
    return dict(model=name, channels_per_layer=model.config.gtu_dim, layers=len(layers),
                fit_seconds=list(timing.samples), fit_seconds_median=timing.median, spread=timing.spread,
                state_bytes_per_sequence=states[1] - states[0],
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


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3, help="fits timed per model (median reported)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--output_dir", default="results/bench_compact_fit")
    args = parser.parse_args(argv)
    if args.runs < 1:
        raise ValueError(f"--runs must be at least 1, got {args.runs}.")
    started = CLOCK()
    set_threads(args.threads)
    torch.manual_seed(0)
    models = {"benchmark": benchmark_model(), "demo": demo_model()}
    work = {name: workload(lambda m=model: first_cached_forward(m), before=lambda m=model: clear_fits(m))
            for name, model in models.items()}
    timings = interleaved(work, rounds=args.runs, warmup=0, progress="compact fit")
    results = [describe(name, model, timings[name]) for name, model in models.items()]
    table = render(results)
    print(table)
    write_report(args.output_dir, "compact fit", command_line(SCRIPT, argv), vars(args), results, table,
                 figure="fit.png", timings=timings, started=started)


if __name__ == "__main__":
    main()
