"""Prefill at the forward's cost (issue 38): what the forward that returns the decoding state costs beside the plain
forward and beside the matched Llama's prefill, a long prompt fed in chunks against the same prompt in one shot, and
a 32,768-token prompt with each call's peak memory.

Measured as a user calls the model, on the scale ladder's rungs (:func:`~.scale_ladder.build_pair`: a TNN preset at
its initial weights, dropout 0, against the Llama of matched parameter count), batch 1, one torch thread, the plan
fitted first by one cached forward of 4 tokens:

* ``plain``: ``model(ids, use_cache=False, logits_to_keep=1)``, the TNN forward alone;
* ``state``: ``model(ids, use_cache=True, logits_to_keep=1)``, the forward that returns the decoding state (the
  prefill ``generate`` runs on every prompt);
* ``llama``: the same call on the matched Llama (its prefill, which returns its KV cache);
* ``one-shot`` against ``chunked``: ``--chunk_prompt`` tokens in one prefill, and the same tokens as ``--chunks``
  equal chunks, each later one continuing the returned cache (``cache=out.cache``, no attention mask: a serving
  engine's chunked prefill); the relative error max|a - b| / max|a| of the last position's logits between the two.

Every variant of a row runs twice untimed first: a warm-up (what a first call at a new length allocates for good, the
kernel constants at that length, stays out of the peak), then once with its peak memory read: the kernel's
high-water mark of the resident set over the resident set before the call
(:func:`~.scale_ladder_training.peak_reset`, freed heap handed back to the system first so that it does not hide a
peak). The rounds that follow interleave the row's variants through the harness; each row's ratios are of medians of
the same rounds.

Targets (issue 38, stated at the 48.7M rung; the other rungs are reported beside): the state forward <= 1.10x the
plain forward at every ``--lengths`` prompt; Llama's prefill / TNN's >= 0.95x at 2,048 tokens and >= 1.4x at 8,192;
chunked <= 1.15x one-shot with the last logits within 1e-4. The ``--long_length`` row (at ``--long_rungs``) has no
target: its peak memory is its point.

    python run_scripts/bench_prefill.py                           # rungs 6M and 48.7M (about 15 minutes idle)
    python run_scripts/bench_prefill.py --rungs 6M,48.7M,125M,350M  # the ladder's other rungs beside them
    python run_scripts/bench_prefill.py --quick --output_dir outputs/prefill_quick
"""

from __future__ import annotations

import argparse
import ctypes
import ctypes.util
import gc
import resource
from collections.abc import Callable

import torch

from modeling_tnn.modeling_tnn import CACHE_FIELD

from .harness import (CLOCK, command_line, interleaved, pyplot, save_figure, set_threads, workload,
                      write_report)
from .reference_models import count_parameters
from .scale_ladder import QUICK_RUNGS, RUNGS, build_pair
from .scale_ladder_training import peak_over, peak_reset

SCRIPT = "run_scripts/bench_prefill.py"
FULL_COMMAND = f"python {SCRIPT} --output_dir results/bench_prefill"  # what make bench runs (plan.py)
ALL_RUNGS = {**RUNGS, **QUICK_RUNGS}
VARIANTS = ("plain", "state", "llama")
FIT_TOKENS = 4
STATE_TARGET = 1.10  # state forward / plain forward, at most
LLAMA_TARGETS = {2048: 0.95, 8192: 1.4}  # Llama's prefill / TNN's, at least, per prompt length
CHUNK_TARGET, ERROR_TARGET = 1.15, 1e-4  # chunked / one-shot at most; relative error of the last logits at most
# --quick: the tiny rungs at toy sizes (seconds; a check that everything runs, its numbers mean nothing).
QUICK = dict(rungs="tiny-32,tiny-64", lengths="512,2048", chunk_prompt=4096, chunks=8, long_length=8192,
             long_rungs="tiny-32", rounds=2, long_rounds=1)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rungs", default="6M,48.7M", help=f"comma list of {list(RUNGS)} (--quick: "
                        f"{list(QUICK_RUNGS)}; default: %(default)s)")
    parser.add_argument("--lengths", default="2048,8192", help="prompt lengths of the prefill rows")
    parser.add_argument("--chunk_prompt", type=int, default=16384, help="tokens of the chunked-prefill row")
    parser.add_argument("--chunks", type=int, default=8, help="equal chunks the chunked row feeds them in")
    parser.add_argument("--long_length", type=int, default=32768, help="prompt of the long row (0: none)")
    parser.add_argument("--long_rungs", default="6M,48.7M", help="the rungs of --rungs that run the long row")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds of the prefill and chunked rows")
    parser.add_argument("--long_rounds", type=int, default=1, help="interleaved rounds of the long row")
    parser.add_argument("--quick", action="store_true", help="tiny rungs at toy sizes: checks that it all runs")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output_dir", default="results/bench_prefill")
    args = parser.parse_args(argv)
    given = vars(args)  # the namespace's own dict: --quick rewrites the settings left at their defaults
    if args.quick:
        for key, value in QUICK.items():
            if given[key] == parser.get_default(key):
                given[key] = value
    allowed = QUICK_RUNGS if args.quick else RUNGS
    for key in ("rungs", "long_rungs"):
        given[key] = [name.strip() for name in given[key].split(",") if name.strip()]
        unknown = [name for name in given[key] if name not in allowed]
        if unknown:
            raise ValueError(f"--{key} {unknown}: allowed values are {list(allowed)}"
                             + (" (with --quick)" if args.quick else ""))
    try:
        args.lengths = [int(value) for value in args.lengths.split(",") if value.strip()]
    except ValueError:
        raise ValueError(f"--lengths must be a comma list of positive integers, got {args.lengths!r}") from None
    if not args.rungs or any(n < 1 for n in args.lengths):
        raise ValueError(f"--rungs must name at least one rung and --lengths hold positive integers, got "
                         f"{args.rungs}, {args.lengths}")
    if args.chunks < 1 or args.chunk_prompt < args.chunks or args.chunk_prompt % args.chunks:
        raise ValueError(f"--chunk_prompt must be a positive multiple of --chunks (at least 1), got "
                         f"{args.chunk_prompt} and {args.chunks}")
    if args.long_length < 0 or args.rounds < 1 or args.long_rounds < 1:
        raise ValueError(f"--long_length must be at least 0 and --rounds, --long_rounds at least 1, got "
                         f"{args.long_length}, {args.rounds}, {args.long_rounds}")
    return args


# -- what one row measures -----------------------------------------------------------------------------------------


def relative_error(reference: torch.Tensor, other: torch.Tensor) -> float:
    """max|reference - other| / max|reference|, in float64."""
    reference, other = reference.double(), other.double()
    return ((reference - other).abs().max() / reference.abs().max()).item()


def release_free_heap() -> None:
    """Collect garbage and hand the C heap's free pages back to the system (glibc's ``malloc_trim``), so that the
    resident set a peak is measured over holds no freed memory a later call would reuse unseen."""
    gc.collect()
    name = ctypes.util.find_library("c")
    libc = ctypes.CDLL(name) if name else None
    if libc is not None and hasattr(libc, "malloc_trim"):
        libc.malloc_trim(0)


def peak_mb(call: Callable[[], object]) -> float | None:
    """Run ``call`` once; the peak of the resident set during it over the resident set before it, MB (None where
    the kernel's high-water mark cannot be reset)."""
    release_free_heap()
    before = peak_reset()
    call()
    return peak_over(before)


def prefill(model, ids: torch.Tensor, use_cache: bool, logits: dict, key: str) -> Callable[[], None]:
    """A call of ``model`` over ``ids`` as a user's prefill (``logits_to_keep=1``) that keeps its last logits under
    ``logits[key]`` (and drops the cache it returns)."""
    def call():
        logits[key] = model(input_ids=ids, use_cache=use_cache, logits_to_keep=1).logits[0, -1]
    return call


def chunked_prefill(model, ids: torch.Tensor, chunks: int, logits: dict, key: str) -> list[Callable[[], None]]:
    """One callable per chunk of ``ids``: the first a prefill, each later one continuing the cache the previous
    returned (``CACHE_FIELD``, no attention mask); the last keeps its last logits under ``logits[key]``."""
    pieces, held = ids.chunk(chunks, dim=1), {}

    def feed(index: int) -> Callable[[], None]:
        def call():
            previous = {CACHE_FIELD: held.pop("cache")} if index else {}
            out = model(input_ids=pieces[index], use_cache=True, logits_to_keep=1, **previous)
            if index + 1 < len(pieces):
                held["cache"] = getattr(out, CACHE_FIELD)
            else:
                logits[key] = out.logits[0, -1]
        return call
    return [feed(index) for index in range(len(pieces))]


def measure(works: dict, calls: dict, rounds: int, progress: str) -> tuple[dict, dict]:
    """Each variant's whole run (``calls[key]``) twice untimed, a warm-up and then its peak MB, and ``rounds``
    interleaved rounds of ``works``; returns (timings, peaks). The warm-up keeps what a first call at a new length
    allocates for good (the mixers' kernel constants at that length, FFT plans) out of the peak: otherwise the
    variant that happens to run first would carry it."""
    for call in calls.values():
        call()
    peaks = {key: peak_mb(calls[key]) for key in works}
    return interleaved(works, rounds=rounds, warmup=0, progress=progress), peaks


def prompt_row(rung: str, tnn, llama, length: int, rounds: int, seed: int) -> dict:
    """The plain forward, the forward returning the state and Llama's prefill over one ``length``-token prompt."""
    ids = torch.randint(1, tnn.config.vocab_size, (1, length), generator=torch.Generator().manual_seed(seed))
    logits = {}
    calls = dict(plain=prefill(tnn, ids, False, logits, "plain"), state=prefill(tnn, ids, True, logits, "state"),
                 llama=prefill(llama, ids, True, logits, "llama"))
    timings, peaks = measure({key: workload(call) for key, call in calls.items()}, calls, rounds,
                             f"{rung} prefill of {length}")
    seconds = {key: timing.median for key, timing in timings.items()}
    return dict(rung=rung, tokens=length, plain_s=seconds["plain"], state_s=seconds["state"],
                llama_s=seconds["llama"], state_over_plain=seconds["state"] / seconds["plain"],
                llama_over_tnn=seconds["llama"] / seconds["state"],
                state_error=relative_error(logits["plain"], logits["state"]),
                peak_mb={key: peaks[key] for key in VARIANTS},
                timings={key: timing.summary() for key, timing in timings.items()})


def chunked_row(rung: str, tnn, prompt: int, chunks: int, rounds: int, seed: int) -> dict:
    """``prompt`` tokens in one prefill against the same tokens in ``chunks`` chunks, each continuing the cache."""
    ids = torch.randint(1, tnn.config.vocab_size, (1, prompt), generator=torch.Generator().manual_seed(seed))
    logits = {}
    one_shot = prefill(tnn, ids, True, logits, "one-shot")
    pieces = chunked_prefill(tnn, ids, chunks, logits, "chunked")
    names = tuple(f"chunk {index + 1}" for index in range(chunks))
    works = {"one-shot": workload(one_shot), "chunked": workload(*pieces, names=names)}
    calls = {"one-shot": one_shot, "chunked": lambda: [piece() for piece in pieces]}
    timings, peaks = measure(works, calls, rounds, f"{rung} {prompt} tokens in {chunks} chunks")
    whole, parts = timings["one-shot"].median, timings["chunked"].median
    summary = timings["chunked"].summary()
    return dict(rung=rung, tokens=prompt, chunks=chunks, chunk_tokens=prompt // chunks, one_shot_s=whole,
                chunked_s=parts, chunked_over_one_shot=parts / whole,
                error=relative_error(logits["one-shot"], logits["chunked"]),
                first_chunk_s=summary[f"{names[0]}_median_s"], last_chunk_s=summary[f"{names[-1]}_median_s"],
                peak_mb={"one-shot": peaks["one-shot"], "chunked": peaks["chunked"]},
                timings={key: timing.summary() for key, timing in timings.items()})


def measure_rung(args: argparse.Namespace, name: str) -> dict:
    """Every row of one rung: the plan fitted first, then the prefill rows, the long row, the chunked row."""
    tnn, llama = build_pair(ALL_RUNGS[name], args.seed)
    with torch.no_grad():
        tnn(input_ids=torch.ones(1, FIT_TOKENS, dtype=torch.long), use_cache=True)  # the plan, fitted once
        rows = [prompt_row(name, tnn, llama, n, args.rounds, args.seed) for n in args.lengths]
        long = ([prompt_row(name, tnn, llama, args.long_length, args.long_rounds, args.seed)]
                if args.long_length and name in args.long_rungs else [])
        chunked = chunked_row(name, tnn, args.chunk_prompt, args.chunks, args.rounds, args.seed)
    return dict(rung=name, parameters=dict(tnn=count_parameters(tnn), llama=count_parameters(llama)),
                llama_intermediate_size=llama.config.intermediate_size, prefill=rows, long=long, chunked=chunked)


# -- targets, table, figure ----------------------------------------------------------------------------------------


def targets(records: list[dict]) -> list[dict]:
    """One row per target of issue 38 that the records cover: rung, what, measured, rule, met."""
    rows = []
    for record in records:
        rung = record["rung"]
        for row in record["prefill"]:
            n = row["tokens"]
            rows.append(dict(rung=rung, target=f"state forward / plain @{n}", measured=row["state_over_plain"],
                             rule=f"<= {STATE_TARGET:.2f}x", met=row["state_over_plain"] <= STATE_TARGET))
            if n in LLAMA_TARGETS:
                rows.append(dict(rung=rung, target=f"Llama / TNN prefill @{n}", measured=row["llama_over_tnn"],
                                 rule=f">= {LLAMA_TARGETS[n]:.2f}x", met=row["llama_over_tnn"] >= LLAMA_TARGETS[n]))
        chunked = record["chunked"]
        what = f"{chunked['tokens']} in {chunked['chunks']} chunks"
        rows.append(dict(rung=rung, target=f"{what} / one-shot", measured=chunked["chunked_over_one_shot"],
                         rule=f"<= {CHUNK_TARGET:.2f}x", met=chunked["chunked_over_one_shot"] <= CHUNK_TARGET))
        rows.append(dict(rung=rung, target=f"{what}: last logits' error", measured=chunked["error"],
                         rule=f"<= {ERROR_TARGET:.0e}", met=chunked["error"] <= ERROR_TARGET))
    return rows


def _mb(value: float | None) -> str:
    return "—" if value is None else f"{value:,.0f}"


def table(args: argparse.Namespace, records: list[dict], goals: list[dict]) -> str:
    lines = []
    if args.quick:
        lines += ["**Quick run (`--quick`: tiny rungs, toy sizes): it checks that the benchmark runs; its numbers mean "
                  f"nothing. The measurement is `{FULL_COMMAND}`.**", ""]
    lines += ["Prefill, batch 1, `logits_to_keep=1`, one torch thread, the plan fitted first (median seconds of "
              "interleaved rounds). plain: TNN's forward with `use_cache=False`; state: with `use_cache=True` (the "
              "forward that returns the decoding state); Llama: the matched Llama's prefill (KV cache). Peak: MB of "
              "one call over the resident set before it. error: the last logits of the state forward against the "
              "plain forward's, max|a - b| / max|a|.", "",
              "| rung | prompt | TNN plain s | TNN state s | state / plain | Llama s | Llama / TNN | "
              "peak MB plain / state / Llama | error |", "|---" * 9 + "|"]
    for record in records:
        for row in record["prefill"] + record["long"]:
            peaks = " / ".join(_mb(row["peak_mb"][key]) for key in VARIANTS)
            lines.append(f"| {record['rung']} | {row['tokens']:,} | {row['plain_s']:.3f} | {row['state_s']:.3f} | "
                         f"{row['state_over_plain']:.2f}x | {row['llama_s']:.3f} | {row['llama_over_tnn']:.2f}x | "
                         f"{peaks} | {row['state_error']:.1e} |")
    lines += ["", "Chunked prefill: the prompt in equal chunks, each continuing the returned cache "
              "(`cache=out.cache`, no attention mask), against the same prompt in one prefill; error: the last "
              "logits, max|one-shot - chunked| / max|one-shot|.", "",
              "| rung | prompt | chunks | one-shot s | chunked s | chunked / one-shot | first / last chunk s | "
              "peak MB one-shot / chunked | error |", "|---" * 9 + "|"]
    for record in records:
        row = record["chunked"]
        lines.append(f"| {record['rung']} | {row['tokens']:,} | {row['chunks']} x {row['chunk_tokens']:,} | "
                     f"{row['one_shot_s']:.3f} | {row['chunked_s']:.3f} | {row['chunked_over_one_shot']:.2f}x | "
                     f"{row['first_chunk_s']:.3f} / {row['last_chunk_s']:.3f} | {_mb(row['peak_mb']['one-shot'])} / "
                     f"{_mb(row['peak_mb']['chunked'])} | {row['error']:.1e} |")
    lines += ["", "Targets of issue 38 (stated at the 48.7M rung; the other rungs beside it):", "",
              "| rung | target | measured | rule | met |", "|---|---|---|---|---|"]
    for goal in goals:
        value = f"{goal['measured']:.1e}" if "error" in goal["target"] else f"{goal['measured']:.2f}x"
        lines.append(f"| {goal['rung']} | {goal['target']} | {value} | {goal['rule']} | "
                     f"{'met' if goal['met'] else '**missed**'} |")
    return "\n".join(lines) + "\n"


def plot(records: list[dict], goals: list[dict], path) -> None:
    """Left: seconds against prompt length per rung and variant; right: each target's measured ratio and its rule."""
    plt = pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    styles = dict(plain=":", state="-", llama="--")
    for index, record in enumerate(records):
        rows = sorted(record["prefill"] + record["long"], key=lambda row: row["tokens"])
        for variant, style in styles.items():
            left.plot([row["tokens"] for row in rows], [row[f"{variant}_s"] for row in rows], style, marker="o",
                      color=f"C{index}", label=f"{record['rung']} {'TNN ' if variant != 'llama' else ''}{variant}")
    left.set(xscale="log", yscale="log", xlabel="prompt tokens", ylabel="seconds (median)",
             title="Prefill, batch 1, one thread")
    lengths = sorted({row["tokens"] for record in records for row in record["prefill"] + record["long"]})
    left.set_xticks(lengths, [f"{n:,}" for n in lengths], minor=False)
    left.set_xticks([], minor=True)
    left.legend(fontsize=7, ncol=2)
    left.grid(True, which="both", alpha=0.3)
    ratios = [goal for goal in goals if "error" not in goal["target"]]
    labels = [f"{goal['rung']} {goal['target']}" for goal in ratios]
    right.barh(range(len(ratios)), [goal["measured"] for goal in ratios],
               color=["#4c72b0" if goal["met"] else "#c44e52" for goal in ratios])
    right.scatter([float(goal["rule"].split()[1].rstrip("x")) for goal in ratios], range(len(ratios)), marker="|",
                  s=200, color="black", label="target")
    right.set_yticks(range(len(ratios)), labels, fontsize=7)
    right.invert_yaxis()
    right.set(xlabel="ratio (blue: met, red: missed)", title="Issue 38's targets")
    right.legend(fontsize=7)
    save_figure(fig, path)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    started = CLOCK()
    set_threads(args.threads)
    records = [measure_rung(args, name) for name in args.rungs]
    goals = targets(records)
    for goal in goals:
        print(f"{goal['rung']} {goal['target']}: {goal['measured']:.3g} ({goal['rule']}: "
              f"{'met' if goal['met'] else 'missed'})")
    command = command_line(SCRIPT, argv)
    settings = {key: value for key, value in vars(args).items() if key != "output_dir"}
    results = dict(rungs=records, targets=goals,
                   process_peak_rss_mb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
    write_report(args.output_dir, "bench_prefill", command, settings, results, table(args, records, goals),
                 plot=lambda path: plot(records, goals, path), started=started)
