"""What a decode step is made of, TNN against the scale ladder's Llama: the step, its matrix products alone, and
TNN's decoding state, at the rows where issue 29's ">= 1.5x at 2,048 tokens, batch 1" is missed.

At batch 1 a decode step reads every weight once, and TNN and its Llama have the same parameter count by
construction (:func:`~.scale_ladder.build_pair`): their matrix-vector products cost the same. TNN's lead can only
come from what Llama does besides (its KV cache: attention and the cache's growth) minus what TNN does besides (its
decoding state, norms, gating, Python). This benchmark measures those parts in one run, interleaved:

* ``step``: a decode step after a ``--context``-token state (:func:`~.scale_ladder.tnn_state`,
  :func:`~.generation.kv_cache`), as the ladder times it: each timed call runs ``DECODE_TOKENS`` consecutive steps
  (a whole fold period of the compact state, folds included) right after an untimed call of the same; per token;
* ``linear``: the same step's ``nn.Linear`` calls alone (recorded by hooks on one step, replayed on inputs of the
  recorded shapes): the weights' read, the floor of any implementation of the model;
* TNN's ``state`` and ``norms``: the time inside its layers' decoding-state steps (the window and the modes) and
  inside its norms (forward hooks), in a call of the same steps of their own, so that ``step`` runs without timers;
* with ``--narrow_head 1``, TNN's step and its linear calls again with the LM head swapped for a hidden x hidden
  one (:func:`swapped_head`): at the ladder's sizes the head is the largest weight (the 48.7M rung's, 50,264 x 512,
  is 103 MB, over half the step's read), and its read evicts the last-level cache that the rest of the step
  runs from. ``head_share_ms`` is how much less the step spends beyond its linear calls without it;
* Llama's step with a ``StaticCache`` too (allocated once, written in place; ``generate``'s
  ``cache_implementation="static"``), beside the ladder's ``DynamicCache`` (which concatenates every new key and
  value, so a step copies the whole cache): how much of TNN's lead is the dynamic cache's growth.

``ceiling`` is Llama's step over TNN's linear floor: the ratio TNN would reach if everything but its matrix products
cost nothing. ``budget_ms`` is what TNN may spend beyond its floor for ``--target`` (Llama's step / target - floor).

    python run_scripts/bench_decode_floor.py --output_dir results/bench_decode_floor
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Callable
from contextlib import contextmanager

import torch

from ...rpe import SimpleRMSNorm
from .generation import kv_cache
from .harness import (CLOCK, DECODE_TOKENS, command_line, consecutive, interleaved, pyplot, save_figure, set_threads, workload,
                      write_report)
from .reference_models import count_parameters
from .scale_ladder import QUICK_RUNGS, RUNGS, build_pair, decode_step, tnn_state

SCRIPT = "run_scripts/bench_decode_floor.py"
ALL_RUNGS = {**RUNGS, **QUICK_RUNGS}  # the tiny rungs for a quick run


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rungs", default="48.7M,125M", help=f"comma list of {list(ALL_RUNGS)} (default: %(default)s)")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--context", type=int, default=2048, help="tokens the state has seen")
    parser.add_argument("--rounds", type=int, default=20, help="interleaved timing rounds")
    parser.add_argument("--target", type=float, default=1.5, help="the decode ratio the budget is computed for")
    parser.add_argument("--compiled", type=int, default=0, choices=(0, 1),
                        help="1: also time TNN's step torch.compile'd (inductor; compiled in the warm-up round)")
    parser.add_argument("--narrow_head", type=int, default=0, choices=(0, 1),
                        help="1: also time TNN's step and its linear calls with a hidden x hidden LM head, to measure "
                             "what the head's read costs the rest of the step")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output_dir", default="results/bench_decode_floor")
    args = parser.parse_args(argv)
    args.rungs = [name.strip() for name in args.rungs.split(",") if name.strip()]
    unknown = [name for name in args.rungs if name not in ALL_RUNGS]
    if unknown or args.batch < 1 or args.context < 1 or args.rounds < 1 or args.target <= 0:
        raise ValueError(f"--rungs must name rungs of {list(ALL_RUNGS)} (got unknown {unknown}); --batch, --context "
                         "and --rounds must be at least 1 and --target positive.")
    return args


def linear_calls(step: Callable[[], object], model: torch.nn.Module) -> tuple[Callable[[], None], int]:
    """A callable that runs the ``nn.Linear`` calls of one ``step`` of ``model`` alone, in order, on fixed random
    inputs of the shapes the step gave them, and how many calls that is."""
    calls = []
    hooks = [module.register_forward_pre_hook(lambda module, inputs: calls.append((module, inputs[0].shape)))
             for module in model.modules() if isinstance(module, torch.nn.Linear)]
    try:
        with torch.no_grad():
            step()
    finally:
        for hook in hooks:
            hook.remove()
    replay = [(module, torch.randn(shape)) for module, shape in calls]

    @torch.no_grad()
    def linears():
        for module, x in replay:
            module(x)
    return linears, len(replay)


def linear_floor(model: torch.nn.Module, cache, batch: int) -> tuple[Callable[[], None], int]:
    """The Linear calls of one decode step of ``model`` on ``cache`` (:func:`linear_calls`), replayed
    ``DECODE_TOKENS`` times a call as the step is timed, and how many calls a step makes."""
    linears, count = linear_calls(torch.no_grad()(decode_step(model, cache, batch, tokens=1)), model)
    return consecutive(linears, DECODE_TOKENS), count


@contextmanager
def swapped_head(model: torch.nn.Module, head: torch.nn.Module):
    """``model.lm_head`` replaced by ``head`` inside the block, restored after (on error too)."""
    original = model.lm_head
    model.lm_head = head
    try:
        yield
    finally:
        model.lm_head = original


def narrow_head_work(model: torch.nn.Module, cache, batch: int) -> tuple[Callable[[], None], Callable[[], None]]:
    """``model``'s decode steps on ``cache`` (``DECODE_TOKENS`` a call) and their linear calls, both with the LM head
    swapped for a hidden x hidden ``nn.Linear`` (:func:`swapped_head`) for the call's duration."""
    width = model.config.hidden_size
    head = torch.nn.Linear(width, width, bias=False)
    steps = torch.no_grad()(decode_step(model, cache, batch))
    with swapped_head(model, head):
        floor, _ = linear_floor(model, cache, batch)

    def step():
        with swapped_head(model, head):
            steps()
    return step, floor


def block_norms(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The norms a decode step runs: every ``SimpleRMSNorm`` and ``LayerNorm`` outside the token mixers (whose RPE
    has norms of its own, which a step does not evaluate)."""
    return [module for name, module in model.named_modules()
            if isinstance(module, (SimpleRMSNorm, torch.nn.LayerNorm)) and ".token_mixer." not in name]


@contextmanager
def parts_clock(model: torch.nn.Module, cache):
    """Adds the seconds spent in the cache's layer states' ``step`` calls and in ``model``'s norms
    (:func:`block_norms`, timed by forward hooks) to the yielded ``{"state": [s], "norms": [s]}``."""
    spent = {"state": [0.0], "norms": [0.0]}
    states = [layer.state for layer in cache.layers if layer.state is not None]
    started = [0.0]

    def timed(original):
        def step(*args, **kwargs):
            start = CLOCK()
            out = original(*args, **kwargs)
            spent["state"][0] += CLOCK() - start
            return out
        return step

    def norm_started(module, inputs):
        started[0] = CLOCK()

    def norm_ended(module, inputs, output):
        spent["norms"][0] += CLOCK() - started[0]
    norms = block_norms(model)
    hooks = [hook for module in norms for hook in (module.register_forward_pre_hook(norm_started),
                                                   module.register_forward_hook(norm_ended))]
    for state in states:
        state.step = timed(state.step)  # an instance attribute over the class's method, removed below
    try:
        yield spent
    finally:
        for state in states:
            del state.step
        for hook in hooks:
            hook.remove()


def measure(args, name: str) -> dict:
    """One rung's step, linear floor and (TNN) state and norm time, interleaved over ``args.rounds`` rounds."""
    tnn, llama = build_pair(ALL_RUNGS[name], args.seed)
    with torch.no_grad():
        caches = dict(tnn=tnn_state(tnn, args.batch, args.context), llama=kv_cache(llama, args.batch, args.context))
    # The static cache has room for every step this run makes (a warm-up round and the rounds, two calls of
    # DECODE_TOKENS steps each).
    caches["llama static"] = kv_cache(llama, args.batch, args.context,
                                      room=2 * (args.rounds + 1) * DECODE_TOKENS + 4)
    steps = {model: torch.no_grad()(decode_step(net, caches[model], args.batch))
             for model, net in (("tnn", tnn), ("llama", llama), ("llama static", llama))}
    floors, counts = {}, {}
    for model, net in (("tnn", tnn), ("llama", llama)):
        floors[model], counts[model] = linear_floor(net, caches[model], args.batch)
    parts_seconds = []

    def tnn_parts():  # the step with its parts timed, apart from the step itself (the timers cost a few us a call)
        with parts_clock(tnn, caches["tnn"]) as spent:
            steps["tnn"]()
        parts_seconds.append({part: seconds for part, (seconds,) in spent.items()})
    # Each timed call after an untimed one of the same work, as the ladder times its decode steps.
    work = {("tnn", "step"): workload(steps["tnn"], before=steps["tnn"]),
            ("tnn", "parts"): workload(tnn_parts, before=steps["tnn"]),
            ("tnn", "linear"): workload(floors["tnn"], before=floors["tnn"]),
            ("llama", "step"): workload(steps["llama"], before=steps["llama"]),
            ("llama", "linear"): workload(floors["llama"], before=floors["llama"]),
            ("llama static", "step"): workload(steps["llama static"], before=steps["llama static"])}
    if args.narrow_head:  # on the same cache
        narrow_step, narrow_floor = narrow_head_work(tnn, caches["tnn"], args.batch)
        work["tnn narrow head", "step"] = workload(narrow_step, before=narrow_step)
        work["tnn narrow head", "linear"] = workload(narrow_floor, before=narrow_floor)
    if args.compiled:  # on the same cache: its graphs (the first count's, then folding or not) built while warming up
        torch._dynamo.reset()  # dynamo counts graphs per code object: an earlier rung's would use up the limit
        compiled = torch.no_grad()(decode_step(torch.compile(tnn), caches["tnn"], args.batch))
        work["tnn compiled", "step"] = workload(compiled, before=compiled)
    timings = interleaved(work, rounds=args.rounds, warmup=1, progress=f"{name} decode parts")
    timings = {key: timing.per(DECODE_TOKENS) for key, timing in timings.items()}
    ms = {key: timing.median * 1e3 for key, timing in timings.items()}
    state, norms = (statistics.median(seconds[part] for seconds in parts_seconds[-args.rounds:]) * 1e3 / DECODE_TOKENS
                    for part in ("state", "norms"))  # the timed rounds' calls
    # Each round's step over the linear calls timed right after it: a shared machine's slow drift cancels in the pair.
    paired = [step / floor - 1 for step, floor in zip(timings["tnn", "step"].samples, timings["tnn", "linear"].samples)]
    quartiles = statistics.quantiles(paired, n=4) if len(paired) > 1 else [paired[0]] * 3
    tnn_ms, floor_ms, llama_ms = ms["tnn", "step"], ms["tnn", "linear"], ms["llama", "step"]
    narrow_ms, narrow_floor_ms = ms.get(("tnn narrow head", "step")), ms.get(("tnn narrow head", "linear"))
    narrow = (dict.fromkeys(("narrow_head_step_ms", "narrow_head_linear_ms", "narrow_head_beyond_linear",
                             "head_share_ms")) if narrow_ms is None else
              dict(narrow_head_step_ms=narrow_ms, narrow_head_linear_ms=narrow_floor_ms,
                   narrow_head_beyond_linear=narrow_ms / narrow_floor_ms - 1,
                   head_share_ms=(tnn_ms - floor_ms) - (narrow_ms - narrow_floor_ms)))
    return dict(rung=name, batch=args.batch, context=args.context,
                tnn_step_ms=tnn_ms, tnn_linear_ms=floor_ms, tnn_state_ms=state, tnn_norms_ms=norms,
                tnn_other_ms=tnn_ms - floor_ms - state - norms,
                llama_step_ms=llama_ms, llama_linear_ms=ms["llama", "linear"],
                llama_other_ms=llama_ms - ms["llama", "linear"], ratio=llama_ms / tnn_ms, ceiling=llama_ms / floor_ms,
                llama_static_step_ms=ms["llama static", "step"], ratio_static=ms["llama static", "step"] / tnn_ms,
                budget_ms=llama_ms / args.target - floor_ms, spent_ms=tnn_ms - floor_ms,
                beyond_linear=tnn_ms / floor_ms - 1, beyond_linear_paired=quartiles, linear_calls=counts,
                tnn_compiled_step_ms=ms.get(("tnn compiled", "step")), **narrow,
                parameters=dict(tnn=count_parameters(tnn), llama=count_parameters(llama)),
                spread={f"{model} {part}": timing.summary() for (model, part), timing in timings.items()})


def paired_cell(quartiles: list[float]) -> str:
    """``median% (q1-q3%)`` of the per-round ratios."""
    q1, median, q3 = (100 * value for value in quartiles)
    return f"{median:.1f}% ({q1:.1f}-{q3:.1f}%)"


def compiled_cell(row: dict) -> str:
    """``ms (x% beyond linear)`` of TNN's compiled step, ``-`` where it was not timed."""
    compiled = row.get("tnn_compiled_step_ms")
    return "-" if compiled is None else f"{compiled:.2f} ({100 * (compiled / row['tnn_linear_ms'] - 1):.1f}%)"


def narrow_head_cell(row: dict) -> str:
    """``x% (y ms)``: TNN's step beyond its linear calls with a hidden x hidden head, and how many ms less it spends
    beyond them than with its own head; ``-`` where it was not timed."""
    beyond = row.get("narrow_head_beyond_linear")
    return "-" if beyond is None else f"{100 * beyond:.1f}% ({row['head_share_ms']:.2f} ms)"


def table(rows: list[dict], target: float) -> str:
    lines = ["| rung | TNN step | TNN linear | TNN state | TNN norms | TNN other | Llama step | Llama linear | "
             "Llama other | "
             f"ratio | ceiling | TNN beyond floor (budget for {target:g}x) | TNN beyond linear | paired (q1-q3) | "
             "Llama static step | ratio (static) | TNN compiled step (beyond linear) | "
             "TNN beyond linear, narrow head (head's share) |",
             "|" + "---|" * 18]
    for row in rows:
        lines.append(
            f"| {row['rung']} b{row['batch']} @{row['context']} | {row['tnn_step_ms']:.2f} | "
            f"{row['tnn_linear_ms']:.2f} | {row['tnn_state_ms']:.2f} | {row['tnn_norms_ms']:.2f} | "
            f"{row['tnn_other_ms']:.2f} | "
            f"{row['llama_step_ms']:.2f} | {row['llama_linear_ms']:.2f} | {row['llama_other_ms']:.2f} | "
            f"{row['ratio']:.2f}x | {row['ceiling']:.2f}x | {row['spent_ms']:.2f} ({row['budget_ms']:.2f}) | "
            f"{100 * row['beyond_linear']:.1f}% | {paired_cell(row['beyond_linear_paired'])} | "
            f"{row['llama_static_step_ms']:.2f} | {row['ratio_static']:.2f}x | {compiled_cell(row)} | "
            f"{narrow_head_cell(row)} |")
    return (f"Milliseconds per decode step: each timed call runs {DECODE_TOKENS} consecutive steps (the compact state's "
            "folds among them), divided by their number; medians of interleaved rounds. linear: the step's nn.Linear "
            "calls alone; "
            "state and norms: the time inside TNN's decoding-state steps and inside its norms, timed in a call of "
            "their own (the step itself runs without timers); other: the rest (gating, residuals, embedding, "
            "attention and its cache, Python). "
            "ceiling: Llama's step over TNN's linear floor. TNN beyond linear: its step over its linear calls, minus "
            "one; paired: the median (and quartiles) of that ratio within each round. Llama's step and ratio are "
            "with transformers' default DynamicCache (the ladder's); static: with a StaticCache of the same keys "
            "and values. TNN compiled: the same step torch.compile'd (inductor; --compiled 1), on the same cache. "
            "Narrow head (--narrow_head 1): TNN's step and its linear calls with the LM head swapped for a hidden x "
            "hidden one, beyond linear as above; the head's share: how many ms more the step spends beyond its linear "
            "calls with its own head (whose read evicts the caches the rest of the step runs from).\n\n"
            + "\n".join(lines) + "\n")


def plot(rows: list[dict], path) -> None:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(9, 1.6 + 0.35 * 3 * len(rows)))
    labels, position, named = [], 0, set()
    colours = dict(linear="#4c72b0", state="#dd8452", norms="#55a868", other="#8c8c8c")
    for row in rows:
        bars = {"TNN": dict(linear=row["tnn_linear_ms"], state=row["tnn_state_ms"], norms=row["tnn_norms_ms"],
                            other=row["tnn_other_ms"]),
                "Llama": dict(linear=row["llama_linear_ms"], other=row["llama_other_ms"]),
                "Llama static": dict(linear=row["llama_linear_ms"],
                                     other=row["llama_static_step_ms"] - row["llama_linear_ms"])}
        for model, parts in bars.items():
            left = 0.0
            for part, value in parts.items():
                share = value / row["llama_step_ms"]  # each rung in units of its Llama's step: sizes side by side
                ax.barh(position, share, left=left, color=colours[part], label=None if part in named else part)
                named.add(part)
                left += share
            labels.append(f"{row['rung']} {model}")
            position += 1
    ax.set_yticks(range(len(labels)), labels)
    ax.invert_yaxis()
    ax.axvline(1 / 1.5, color="black", linestyle=":", linewidth=1, label="1.5x faster than Llama")
    ax.set_xlabel(f"decode step / Llama's step with a DynamicCache (batch {rows[0]['batch']}, {rows[0]['context']} "
                  "tokens seen)")
    ax.legend(loc="center left", bbox_to_anchor=(1.01, 0.5), frameon=False)  # beside: one rung leaves no room below
    ax.set_title("A decode step's parts: the weights' read, TNN's state and norms, the rest")
    save_figure(fig, path)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    started = CLOCK()
    set_threads(args.threads)
    rows = [measure(args, name) for name in args.rungs]
    for row in rows:
        print(f"{row['rung']}: ratio {row['ratio']:.2f}x, ceiling {row['ceiling']:.2f}x, TNN beyond its floor "
              f"{row['spent_ms']:.2f} ms (budget for {args.target:g}x: {row['budget_ms']:.2f} ms)")
    settings = {key: value for key, value in vars(args).items() if key != "output_dir"}
    write_report(args.output_dir, "bench_decode_floor", command_line(SCRIPT, argv), settings, rows,
                 table(rows, args.target), plot=lambda path: plot(rows, path), started=started)
