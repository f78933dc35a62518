"""Time of the compact decoding state's fit (once per set of weights) and the plan it gives, for the models people
build, at their initialisation or after a short training (``--train_steps``):

- ``benchmark``: the decoding benchmark's model (:mod:`.generation`: the ``small`` preset at hidden 256, 4 layers,
  vocabulary 8,192, ``decay_gamma`` 0.99), 768 channels per layer;
- ``demo``: the model ``make demo`` trains (the ``small`` preset, vocabulary 2,048), 384 channels per layer;
- ``paper_lm``: the TNN paper's language model (``wikitext103_lm``, 48.7M parameters), 7 layers of 1,536 channels;
- ``gpt2_size``: the same preset at hidden 768 and 12 layers (125.7M parameters), 12 layers of 2,304 channels.

With ``--train_steps N`` every model first takes N AdamW steps (learning rate 2e-3, batches of 2 x 256 bytes) of
byte-level language modelling on Tiny Shakespeare (from ``$TNN_DATA_DIR`` or ``../shared/data``): weights that have
moved the way training moves them, the first and last losses recorded.

Each round clears the mixers' memoised kernel constants (untimed) and times what the first cached forward pays: the
fit of every layer plus a 2-token prefill; the rounds interleave the two models; one thread, median of ``--runs``.
The plan (per layer: window, modes, largest certified bound) and the state per sequence (``memory_bytes()`` at batch
2 minus batch 1) come from a cache built after the rounds.

    python run_scripts/bench_compact_fit.py --output_dir results/bench_compact_fit
    python run_scripts/bench_compact_fit.py --models paper_lm gpt2_size --train_steps 100 \
        --output_dir results/bench_compact_fit_trained
"""

from __future__ import annotations

import argparse
import sys

import torch
from tqdm.auto import tqdm

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


def scale_model(**overrides) -> TnnForCausalLM:
    """The paper's language-model preset (``wikitext103_lm``) with ``overrides``, at its initialisation."""
    return TnnForCausalLM(load_preset("wikitext103_lm", dropout=0.0, **overrides)).eval()


MODELS = {"benchmark": benchmark_model, "demo": demo_model, "paper_lm": scale_model,
          "gpt2_size": lambda: scale_model(hidden_size=768, num_hidden_layers=12)}


def train_briefly(model: TnnForCausalLM, steps: int, seed: int = 0) -> dict:
    """``steps`` AdamW steps of byte-level language modelling on Tiny Shakespeare (the bytes are token ids, valid in
    every vocabulary here); returns the first and last losses. The model is left in eval mode."""
    from ..common.data_location import find_data_dir

    folder = find_data_dir()
    text_file = None if folder is None else folder / "tinyshakespeare" / "input.txt"
    if text_file is None or not text_file.exists():
        raise SystemExit("bench_compact_fit.py: error: --train_steps needs Tiny Shakespeare: set TNN_DATA_DIR or lay "
                         "shared/data beside the project.")
    data = torch.tensor(list(text_file.read_bytes()), dtype=torch.long)
    generator = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-3, weight_decay=0.01)
    model.train()
    losses = []
    for _ in tqdm(range(steps), desc="training", leave=False):
        starts = torch.randint(0, len(data) - 257, (2,), generator=generator)
        batch = torch.stack([data[i:i + 256] for i in starts.tolist()])
        loss = model(input_ids=batch, labels=batch).loss
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        losses.append(loss.item())
    model.eval()
    return {"train_steps": steps, "first_loss": losses[0], "last_loss": losses[-1]}


def clear_fits(model: TnnForCausalLM) -> None:
    """Forget every mixer's fitted compact plans (its ``decoding_plans`` store) and memoised kernel constants (what
    ``TokenMixer.cached`` keeps in eval mode, which ``TokenMixer.train`` drops in either mode)."""
    mixers = [m for m in model.modules() if isinstance(m, TokenMixer)]
    if not mixers:
        raise RuntimeError("clear_fits: the model holds no TokenMixer: the mixers moved, update this benchmark.")
    for mixer in mixers:
        mixer.decoding_plans.forget_resolved()
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
    channels = model.config.gtu_dim * len(layers)
    return dict(model=name, parameters=model.num_parameters(), channels_per_layer=model.config.gtu_dim,
                layers=len(layers), fit_seconds=list(timing.samples), fit_seconds_median=timing.median,
                spread=timing.spread, ms_per_channel=1e3 * timing.median / channels,
                every_layer_certified=all(row["plan"] == "compact"
                                          and row["error_bound"] <= model.config.compact_tolerance for row in layers),
                state_bytes_per_sequence=states[1] - states[0],
                max_error_bound=max(row["error_bound"] or 0.0 for row in layers),
                tolerance=model.config.compact_tolerance,
                plan=[{key: row[key] for key in ("plan", "window", "modes", "error_bound")} for row in layers])


def render(results: list[dict]) -> str:
    lines = ["| model | parameters | weights | channels x layers | fit, median (s) | ms per channel | runs (s) | "
             "plan per layer (window + modes) | every layer certified | largest bound | state per sequence (bytes) |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        plan = ", ".join(f"{row['window']}+{row['modes']}" if row["plan"] == "compact" else row["plan"]
                         for row in r["plan"])
        runs = " / ".join(f"{s:.1f}" for s in r["fit_seconds"])
        weights = (f"trained {r['train_steps']} steps (loss {r['first_loss']:.2f} -> {r['last_loss']:.2f})"
                   if r.get("train_steps") else "initial")
        lines.append(f"| {r['model']} | {r['parameters'] / 1e6:.1f}M | {weights} | {r['channels_per_layer']} x "
                     f"{r['layers']} | {r['fit_seconds_median']:.2f} | {r['ms_per_channel']:.3f} | {runs} | {plan} | "
                     f"{'yes' if r['every_layer_certified'] else 'no'} | {r['max_error_bound']:.1e} | "
                     f"{r['state_bytes_per_sequence']:,} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3, help="fits timed per model (median reported)")
    parser.add_argument("--models", nargs="+", choices=list(MODELS), default=list(MODELS))
    parser.add_argument("--train_steps", type=int, default=0,
                        help="byte-level LM steps on Tiny Shakespeare before the fit (0: initial weights)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--output_dir", default="results/bench_compact_fit")
    args = parser.parse_args(argv)
    if args.runs < 1:
        raise ValueError(f"--runs must be at least 1, got {args.runs}.")
    started = CLOCK()
    set_threads(args.threads)
    torch.manual_seed(0)
    if args.train_steps < 0:
        raise ValueError(f"--train_steps must be at least 0, got {args.train_steps}.")
    models = {name: MODELS[name]() for name in args.models}
    training = {name: train_briefly(model, args.train_steps) if args.train_steps else {}
                for name, model in models.items()}
    work = {name: workload(lambda m=model: first_cached_forward(m), before=lambda m=model: clear_fits(m))
            for name, model in models.items()}
    timings = interleaved(work, rounds=args.runs, warmup=0, progress="compact fit")
    results = [{**describe(name, model, timings[name]), **training[name]} for name, model in models.items()]
    table = render(results)
    print(table)
    write_report(args.output_dir, "compact fit", command_line(SCRIPT, argv), vars(args), results, table,
                 figure="fit.png", timings=timings, started=started)


if __name__ == "__main__":
    main()
