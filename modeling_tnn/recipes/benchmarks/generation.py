"""Generation with the TNN cache against attention's KV cache: per-token decode latency (batch 1 and 8) and state
memory against context length, the prefill of a long prompt, and the cached decoder's error against the no-cache
forward up to 32x the ETSC conversion length.

Decoders: TNN (dense and fd) with the default cache (``generation_cache="auto"``: the compact state wherever its
certified bound meets ``compact_tolerance``, see docs/compact-decoding.md), dense with the exact window,
dense without a cache (a full recompute per token, short contexts only), dense with its decode step
``torch.compile``'d (inductor; the state and the prefill as the default's), and GPT-2 and Llama from transformers
(sdpa, their default DynamicCache), tied embeddings, same width, depth and vocabulary, MLP width solved so that the
parameter count matches TNN's (GPT-2's position table, which it needs for long contexts, is counted apart).

Each state is built once per (decoder, batch, context): a KV cache of random keys and values of that length; the TNN
state from a prefill of the last min(context, 2048) tokens with the seen count then set to the context (a step
costs what the state's shape says, and every state reaches its final shape within 2048 tokens). Rounds interleave
every (decoder, batch, context), so load that varies over time hits all alike; medians. Each round runs two
single-token steps of a decoder and times the second: generate decodes one model's tokens back to back, while a first
step would time the cache misses the previous decoder left (a round's first decoder follows Llama's 512 MB KV read at
batch 8 and 8,192 tokens).

The streamer clock times ``generate`` itself (TNN dense and Llama, greedy, from a random prompt of the context's
length): a streamer reads the harness clock at every ``put``, and a token's time is the mean interval between
consecutive new tokens after the first (the prefill precedes the first; folds included); rounds interleave the models.

``--profile_only 1`` instead profiles one decode step of TNN dense and Llama (aten operators, allocations, host
syncs) into its own folder.

    python run_scripts/bench_generation.py --output_dir results/bench_generation
    python run_scripts/bench_generation.py --profile_only 1 --output_dir results/bench_decode_profile
"""

from __future__ import annotations

import argparse
import json
import sys
import warnings
from pathlib import Path

import torch
from tqdm.auto import tqdm
from transformers import DynamicCache, StaticCache

from modeling_tnn import TnnForCausalLM, load_preset
from modeling_tnn.modeling_tnn import CACHE_FIELD

from .harness import (
    CLOCK,
    DECODE_TOKENS,
    StreamerClock,
    command_line,
    consecutive,
    interleaved,
    interleaved_samples,
    pyplot,
    save_figure,
    set_threads,
    time_once,
    workload,
    write_report,
)
from .reference_models import POSITION_TABLES, baseline_model, count_parameters, matched_mlp_width

SCRIPT = "run_scripts/bench_generation.py"
STATE_PREFILL = 2048  # every TNN decoding state has its final shape after this many tokens (see the docstring)


def tnn(args, mixer: str) -> TnnForCausalLM:
    config = load_preset("small", token_mixer=mixer, hidden_size=args.hidden_size, num_hidden_layers=args.num_layers,
                         vocab_size=args.vocab_size, dropout=0.0, etsc_length=args.etsc_length,
                         fd_kernel_length=args.etsc_length, decay_gamma=args.decay_gamma)
    return TnnForCausalLM(config).eval()


def fit_time(model: TnnForCausalLM) -> float:
    """Seconds of the compact plan's fit (all layers, once per set of weights; later caches reuse it)."""
    def first_cached_forward():
        with torch.no_grad():
            model(input_ids=torch.ones(1, 2, dtype=torch.long), use_cache=True)
    _, seconds = time_once(first_cached_forward)
    print(f"compact fit (all layers, with a 2-token prefill): {seconds:.1f} s")
    return seconds


def baseline_sizes(args, positions: int) -> dict:
    """The baselines' sizes: the TNN's width, depth and vocabulary, heads of 64."""
    return dict(vocab_size=args.vocab_size, hidden_size=args.hidden_size, layers=args.num_layers, head_dim=64,
                positions=positions)


def baselines(args, target: int, contexts: list[int]) -> dict[str, torch.nn.Module]:
    """GPT-2 (a position table for every context and step timed, and for the prefill's prompt) and Llama (rotary)
    with the MLP width that matches ``target`` parameters (GPT-2's position table not counted)."""
    models = {}
    steps = (args.rounds + 1) * (DECODE_TOKENS + 1)  # per round an untimed step and a timed call of DECODE_TOKENS
    for kind, positions in (("gpt2", max(*contexts, args.prefill_length) + steps + 64), ("llama", 1 << 17)):
        sizes = baseline_sizes(args, positions)
        width = matched_mlp_width(kind, "causal", target, **sizes)
        models[kind] = baseline_model(kind, "causal", mlp_width=width, **sizes).eval()
    return models


def kv_cache(model, batch: int, context: int, room: int | None = None) -> DynamicCache | StaticCache:
    """A KV cache of ``context`` random keys and values: what attention reads and grows at every step (transformers'
    default ``DynamicCache``, which concatenates each new key and value); with ``room``, a ``StaticCache`` allocated
    for ``context + room`` tokens once, written in place (what ``generate`` uses with ``cache_implementation=
    "static"``)."""
    config = model.config
    heads = config.num_attention_heads
    head_dim = config.hidden_size // heads
    cache = DynamicCache(config=config) if room is None else StaticCache(config=config, max_cache_len=context + room)
    for layer in range(config.num_hidden_layers):
        cache.update(torch.randn(batch, heads, context, head_dim), torch.randn(batch, heads, context, head_dim), layer)
    return cache


def cache_bytes(cache) -> int:
    """Bytes of a decoding state: the TNN cache's own count, or a KV cache's keys and values."""
    if hasattr(cache, "memory_bytes"):
        return cache.memory_bytes()
    return sum(t.numel() * t.element_size() for layer in cache.layers for t in (layer.keys, layer.values))


_COMPILED: dict[int, torch.nn.Module] = {}


def compiled(model: torch.nn.Module) -> torch.nn.Module:
    """``torch.compile(model)`` (inductor), one per model: every decode step of that model shares its graphs."""
    if id(model) not in _COMPILED:
        torch._dynamo.config.recompile_limit = 64  # a graph per (batch, state shape) and the first count's
        _COMPILED[id(model)] = torch.compile(model)
    return _COMPILED[id(model)]


def decoder(name: str, model, batch: int, context: int, vocab: int):
    """(one decode step, state bytes) for ``name`` at (batch, context); ``"(compiled)"`` decoders prefill eagerly and
    step through :func:`compiled`."""
    token = torch.randint(1, vocab, (batch, 1))
    if name.startswith("no cache"):
        ids = torch.randint(1, vocab, (batch, context + 1))
        return (lambda: model(input_ids=ids, use_cache=False)), 0
    if name in ("gpt2", "llama"):
        cache = kv_cache(model, batch, context)
    else:
        mode = "exact" if "exact" in name else "auto"
        out = model(input_ids=torch.randint(1, vocab, (batch, min(context, STATE_PREFILL))), use_cache=True,
                    generation_cache=mode, logits_to_keep=1)
        cache = getattr(out, CACHE_FIELD)
        if context > STATE_PREFILL:
            cache._seen_tokens = context  # the state of a longer context: same shape, a later position
    memory = cache_bytes(cache)
    stepper = compiled(model) if "compiled" in name else model

    def step():
        stepper(input_ids=token, use_cache=True, **{CACHE_FIELD: cache})
    return step, memory


def latency(args, models: dict[str, torch.nn.Module]) -> tuple[list[dict], dict]:
    """Per (decoder, batch, context): the harness's summary of the timed step (after an untimed one of the same
    decoder, as in generate) and the state's bytes; and the timings."""
    contexts = [int(c) for c in args.contexts.split(",")]
    batches = [int(b) for b in args.batch_sizes.split(",")]
    plan = [(name, batch, context) for batch in batches for context in contexts for name in models
            if not (name.startswith("no cache") and context > args.no_cache_max_context)]
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        steps = {key: decoder(*key[:1], models[key[0]], *key[1:], args.vocab_size) for key in tqdm(plan, desc="states")}
        # After an untimed step, as in generate; a cached decoder's timed call: DECODE_TOKENS steps (folds included).
        tokens = {key: 1 if key[0].startswith("no cache") else DECODE_TOKENS for key in steps}
        timings = interleaved({key: workload(consecutive(step, tokens[key]), before=step)
                               for key, (step, _) in steps.items()}, rounds=args.rounds, warmup=1)
        timings = {key: timing.per(tokens[key]) for key, timing in timings.items()}
    results = [dict(decoder=name, batch=batch, context=context, median_ms=1000 * timings[name, batch, context].median,
                    state_bytes=memory, **timings[name, batch, context].summary())
               for (name, batch, context), (_, memory) in steps.items()]
    return results, timings


def streamer_clock(args, models: dict[str, torch.nn.Module]) -> list[dict]:
    """Per-token time of ``generate`` by a streamer's clock, TNN dense (default cache) and Llama, interleaved rounds."""
    pairs = [tuple(int(x) for x in pair.split("x")) for pair in args.streamer_points.split(",")]
    prompts = {(batch, context): torch.randint(1, args.vocab_size, (batch, context)) for batch, context in pairs}

    def sampler(name: str, batch: int, context: int):
        def sample() -> float:
            streamer = StreamerClock()
            models[name].generate(prompts[(batch, context)], max_new_tokens=args.streamer_tokens,
                                  min_new_tokens=args.streamer_tokens, do_sample=False, eos_token_id=None,
                                  pad_token_id=0, streamer=streamer)
            return streamer.token_seconds()
        return sample

    samplers = {(name, batch, context): sampler(name, batch, context) for batch, context in pairs
                for name in ("tnn dense", "llama")}
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        timings = interleaved_samples(samplers, rounds=args.streamer_rounds, progress="streamer clock")
    return [dict(decoder=name, batch=batch, context=context, median_ms=1000 * timing.median, spread=timing.spread)
            for (name, batch, context), timing in timings.items()]


def profile_steps(args, models: dict[str, torch.nn.Module], batch: int = 1, context: int = 256) -> list[dict]:
    """One decode step of TNN dense (default cache) and Llama under torch.profiler: aten operators, allocations
    (operators whose own CPU memory grows), their bytes, and host syncs (``aten::_local_scalar_dense``: ``.item()``,
    ``bool()`` of a tensor)."""
    from torch.profiler import ProfilerActivity, profile

    rows = []
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name in ("tnn dense", "llama"):
            step, _ = decoder(name, models[name], batch, context, args.vocab_size)
            for _ in range(3):
                step()
            with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
                step()
            events = [e for e in prof.events() if e.name.startswith("aten::")]
            allocating = [e for e in events if e.cpu_memory_usage > 0]
            by_operator: dict[str, int] = {}
            for e in allocating:
                by_operator[e.name] = by_operator.get(e.name, 0) + e.cpu_memory_usage
            largest = max(by_operator, key=by_operator.get)
            rows.append(dict(decoder=name, batch=batch, context=context, aten_ops=len(events),
                             allocations=len(allocating), allocated_bytes=sum(e.cpu_memory_usage for e in allocating),
                             host_syncs=sum(e.name == "aten::_local_scalar_dense" for e in events),
                             largest_allocator=largest, largest_allocator_bytes=by_operator[largest]))
    return rows


def prefill(args, models: dict[str, torch.nn.Module]) -> list[dict]:
    """Time of one forward over a ``prefill_length`` prompt that returns the decoding state (batch 1); no warm-up
    round (each round is one long forward)."""
    ids = torch.randint(1, args.vocab_size, (1, args.prefill_length))
    names = [n for n in models if not n.startswith("no cache") and "exact" not in n and "compiled" not in n]

    def forward(name: str):
        return workload(lambda: models[name](input_ids=ids, use_cache=True, logits_to_keep=1))

    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        timings = interleaved({name: forward(name) for name in names}, rounds=args.prefill_rounds, warmup=0,
                              progress="prefill")
    return [dict(decoder=name, tokens=args.prefill_length, median_s=t.median, spread=t.spread)
            for name, t in timings.items()]


def horizon_error(args, models: dict[str, torch.nn.Module]) -> list[dict]:
    """Relative max logit error of cached decoding against the no-cache forward: a prompt of ``total - tokens``,
    then ``tokens`` single steps, at multiples of the conversion length. The models are the speed run's (same
    weights, same compact fit, so the state sizes of the two tables agree)."""
    rows = []
    multiples = [int(m) for m in args.error_multiples.split(",")]
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for mixer in ("dense", "fd"):
            model = models[f"tnn {mixer}"]
            for multiple in tqdm(multiples, desc=f"error ({mixer})"):
                total = multiple * args.etsc_length
                ids = torch.randint(1, args.vocab_size, (1, total))
                full = model(input_ids=ids, use_cache=False).logits[0, -args.error_tokens:]
                for mode in ("auto", "compact", "etsc", "exact"):
                    if mode == "compact" and mixer != "dense":
                        continue
                    if mixer == "dense" and mode == "exact" and args.decay_gamma == 1.0:
                        continue
                    prompt = total - args.error_tokens
                    out = model(input_ids=ids[:, :prompt], use_cache=True, generation_cache=mode, logits_to_keep=1)
                    cache = getattr(out, CACHE_FIELD)
                    decoded = [model(input_ids=ids[:, i:i + 1], **{CACHE_FIELD: cache}).logits[0, -1]
                               for i in range(prompt, total)]
                    error = (torch.stack(decoded) - full).abs().max()
                    layers = cache.describe()
                    bounds = [layer["error_bound"] for layer in layers if layer["error_bound"] is not None]
                    state = f"{layers[0]['plan']} {layers[0]['window']}" + (f" + {layers[0]['modes']} modes"
                                                                           if layers[0]["modes"] else "")
                    rows.append(dict(mixer=mixer, mode=mode, state=state, context=total, multiple=multiple,
                                     max_abs_error=error.item(), relative_error=(error / full.abs().max()).item(),
                                     certified_bound=max(bounds) if bounds else None,
                                     state_bytes_per_sequence=cache.memory_bytes()))
    return rows


def summarise(results: list[dict], contexts: list[int], batches: list[int]) -> dict:
    get = {(r["decoder"], r["batch"], r["context"]): r["median_ms"] for r in results}
    summary = {}
    for name in [n for n in ("tnn dense", "tnn fd", "tnn dense (compiled)") if any(r["decoder"] == n for r in results)]:
        for batch in batches:
            key = f"{name}, batch {batch}"
            ratios = {c: get[("llama", batch, c)] / get[(name, batch, c)] for c in contexts}
            summary[key] = dict(
                llama_over_tnn=ratios,
                gpt2_over_tnn={c: get[("gpt2", batch, c)] / get[(name, batch, c)] for c in contexts},
                flatness=get[(name, batch, max(contexts))] / get[(name, batch, min(contexts))],
            )
    return summary


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--contexts", default="256,512,1024,2048,4096,8192")
    parser.add_argument("--batch_sizes", default="1,8")
    parser.add_argument("--hidden_size", type=int, default=256)
    parser.add_argument("--num_layers", type=int, default=4)
    parser.add_argument("--vocab_size", type=int, default=8192)
    parser.add_argument("--etsc_length", type=int, default=512)
    parser.add_argument("--decay_gamma", type=float, default=0.99)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--no_cache_max_context", type=int, default=512)
    parser.add_argument("--prefill_length", type=int, default=8192)
    parser.add_argument("--prefill_rounds", type=int, default=3)
    parser.add_argument("--error_multiples", default="1,2,4,8,16,32")
    parser.add_argument("--error_tokens", type=int, default=8, help="decoded tokens compared in the error table")
    parser.add_argument("--streamer_points", default="1x256,1x1024,1x2048,1x8192,8x256,8x1024,8x2048",
                        help="(batch)x(context) pairs timed by the streamer clock")
    parser.add_argument("--streamer_rounds", type=int, default=3, help="0 skips the streamer clock")
    parser.add_argument("--streamer_tokens", type=int, default=33, help="new tokens per generate call (33: two folds)")
    parser.add_argument("--compiled", type=int, default=1, help="1: also time TNN dense's step torch.compile'd")
    parser.add_argument("--profile_only", type=int, default=0,
                        help="1: only profile one decode step of TNN dense and Llama (profile.md / profile.json)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--output_dir", default="results/bench_generation")
    return parser.parse_args(argv)


def profile_table(profiled: list[dict]) -> str:
    lines = ["One decode step under torch.profiler (batch 1, 256 tokens)", "",
             "| decoder | aten ops | allocating ops | bytes allocated | host syncs | most bytes allocated by |",
             "|---|---|---|---|---|---|"]
    lines += [f"| {r['decoder']} | {r['aten_ops']} | {r['allocations']} | {r['allocated_bytes']:,} | "
              f"{r['host_syncs']} | {r['largest_allocator']} ({r['largest_allocator_bytes']:,}) |" for r in profiled]
    return "\n".join(lines)


def plot_profile(profiled: list[dict], path) -> None:
    plt = pyplot()

    fig, axes = plt.subplots(1, 2, figsize=(9, 4))
    names = [r["decoder"] for r in profiled]
    axes[0].bar(names, [r["aten_ops"] for r in profiled])
    axes[0].set_ylabel("aten events of one decode step")
    axes[1].bar(names, [r["allocated_bytes"] / 2**10 for r in profiled])
    axes[1].set_ylabel("KiB allocated in one decode step")
    save_figure(fig, path)


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse_args(argv)
    started = CLOCK()
    set_threads(args.threads)
    command = command_line(SCRIPT, argv)
    torch.manual_seed(0)
    contexts = [int(c) for c in args.contexts.split(",")]
    batches = [int(b) for b in args.batch_sizes.split(",")]

    dense, fd = tnn(args, "dense"), tnn(args, "fd")
    fit_seconds = fit_time(dense)
    counts = {"tnn dense": count_parameters(dense), "tnn fd": count_parameters(fd)}
    models = {"tnn dense": dense, "tnn fd": fd, "tnn dense (exact)": dense, "no cache (dense)": dense,
              **({"tnn dense (compiled)": dense} if args.compiled else {}),
              **baselines(args, counts["tnn dense"], contexts)}
    counts["gpt2"] = count_parameters(models["gpt2"], skip=POSITION_TABLES)
    counts["gpt2 position table"] = models["gpt2"].transformer.wpe.weight.numel()
    counts["llama"] = count_parameters(models["llama"])
    print("parameters:", json.dumps(counts))
    settings = vars(args)

    if args.profile_only:
        profiled = profile_steps(args, models)
        table = profile_table(profiled)
        print(table)
        write_report(args.output_dir, "decode step profile", command, settings, dict(profile=profiled), table,
                     figure="profile.png", plot=lambda path: plot_profile(profiled, path), started=started)
        return
    results, _ = latency(args, models)
    clocked = streamer_clock(args, models) if args.streamer_rounds else []
    prefills = prefill(args, models)
    errors = horizon_error(args, models)
    summary = summarise(results, contexts, batches)
    tables = render(results, prefills, errors, summary, contexts, batches, clocked)
    print(tables)
    data = dict(parameters=counts, compact_fit_seconds=fit_seconds, summary=summary, latency=results,
                prefill=prefills, horizon_error=errors, streamer_clock=clocked)
    write_report(args.output_dir, "decoding", command, settings, data, tables, figure="generation.png",
                 plot=lambda path: plot(results, errors, contexts, batches, path), started=started)
    print(f"wrote {args.output_dir}/results.json, table.md, generation.png")


def render(results, prefills, errors, summary, contexts, batches, clocked=()) -> str:
    get = {(r["decoder"], r["batch"], r["context"]): r for r in results}
    names = list(dict.fromkeys(r["decoder"] for r in results))
    parts = []
    for batch in batches:
        lines = [f"Per-token decode, batch {batch} (median ms of a token over runs of {DECODE_TOKENS} consecutive steps; "
                 "state MB = decoding state of the whole batch)", "",
                 "| context | " + " | ".join(names) + " | tnn dense MB | tnn fd MB | llama KV MB | gpt2 KV MB |",
                 "|---" * (len(names) + 5) + "|"]
        for c in contexts:
            cells = [f"{get[(n, batch, c)]['median_ms']:.2f}" if (n, batch, c) in get else "—" for n in names]
            memory = [get[(n, batch, c)]["state_bytes"] / 2**20 for n in ("tnn dense", "tnn fd", "llama", "gpt2")]
            lines.append(f"| {c} | " + " | ".join(cells) + " | " + " | ".join(f"{m:.1f}" for m in memory) + " |")
        parts.append("\n".join(lines))
    lines = ["Speed-up of TNN's decode step (baseline ms / TNN ms; > 1: TNN faster), and flatness t(max)/t(min)", "",
             "| TNN, batch | " + " | ".join(f"llama {c}" for c in contexts) + " | gpt2 at max | flatness |",
             "|---" * (len(contexts) + 3) + "|"]
    for key, row in summary.items():
        lines.append(f"| {key} | " + " | ".join(f"{row['llama_over_tnn'][c]:.2f}" for c in contexts)
                     + f" | {row['gpt2_over_tnn'][max(contexts)]:.2f} | {row['flatness']:.2f} |")
    parts.append("\n".join(lines))
    if clocked:
        parts.append(clock_table(results, clocked))
    lines = [f"Prefill of a {prefills[0]['tokens']}-token prompt, batch 1 (median s)", "",
             "| " + " | ".join(p["decoder"] for p in prefills) + " |", "|---" * len(prefills) + "|",
             "| " + " | ".join(f"{p['median_s']:.2f}" for p in prefills) + " |"]
    parts.append("\n".join(lines))
    lines = ["Cached decoding against the no-cache forward (relative max logit error of the last steps)", "",
             "| mixer | cache | state (layer 0) | bytes per sequence | certified bound (kernel l1) | " + " | ".join(
                 f"{m}x" for m in sorted({e['multiple'] for e in errors})) + " |",
             "|---" * (5 + len({e['multiple'] for e in errors})) + "|"]
    for mixer, mode in dict.fromkeys((e["mixer"], e["mode"]) for e in errors):
        row = sorted((e for e in errors if e["mixer"] == mixer and e["mode"] == mode), key=lambda e: e["multiple"])
        bound = row[-1]["certified_bound"]
        lines.append(f"| {mixer} | {mode} | {row[-1]['state']} | {row[-1]['state_bytes_per_sequence']:,} | "
                     + ("exact" if bound is None else f"{bound:.1e}") + " | "
                     + " | ".join(f"{e['relative_error']:.1e}" for e in row) + " |")
    parts.append("\n".join(lines))
    parts.append(serving(results))
    return "\n\n".join(parts)


def clock_table(results, clocked) -> str:
    """The streamer clock's per-token times of generate beside the step loop's ratio at the same (batch, context)."""
    step = {(r["decoder"], r["batch"], r["context"]): r["median_ms"] for r in results}
    clock = {(r["decoder"], r["batch"], r["context"]): r["median_ms"] for r in clocked}
    lines = ["generate by a streamer's clock (mean ms between new tokens after the first) beside the step loop", "",
             "| batch | context | tnn dense ms | llama ms | llama / tnn (generate) | llama / tnn (step loop) |",
             "|---|---|---|---|---|---|"]
    for batch, context in dict.fromkeys((r["batch"], r["context"]) for r in clocked):
        tnn_ms, llama_ms = clock[("tnn dense", batch, context)], clock[("llama", batch, context)]
        loop = (f"{step[('llama', batch, context)] / step[('tnn dense', batch, context)]:.2f}"
                if ("llama", batch, context) in step else "—")
        lines.append(f"| {batch} | {context} | {tnn_ms:.2f} | {llama_ms:.2f} | {llama_ms / tnn_ms:.2f} | {loop} |")
    return "\n".join(lines)


def serving(results) -> str:
    """How many 2,048-token sequences' decoding state fits in 1 GB (1e9 bytes), from the batch-1 state sizes."""
    get = {(r["decoder"], r["batch"], r["context"]): r["state_bytes"] for r in results}
    lines = ["Serving: 2,048-token sequences whose decoding state fits in 1 GB (1e9 bytes; batch-1 state sizes)", "",
             "| decoder | bytes per sequence | sequences per GB |", "|---|---|---|"]
    for name in ("tnn dense", "tnn dense (exact)", "tnn fd", "llama", "gpt2"):
        if (name, 1, 2048) in get and get[(name, 1, 2048)]:
            per = get[(name, 1, 2048)]
            lines.append(f"| {name} | {per:,} | {int(1e9 // per):,} |")
    return "\n".join(lines)


def plot(results, errors, contexts, batches, path: Path) -> None:
    plt = pyplot()

    get = {(r["decoder"], r["batch"], r["context"]): r for r in results}
    names = list(dict.fromkeys(r["decoder"] for r in results))
    fig, axes = plt.subplots(1, len(batches) + 2, figsize=(6 * (len(batches) + 2), 5))
    for ax, batch in zip(axes, batches):
        for name in names:
            xs = [c for c in contexts if (name, batch, c) in get]
            ax.plot(xs, [get[(name, batch, c)]["median_ms"] for c in xs], marker="o", label=name)
        ax.set_title(f"per-token decode, batch {batch}")
        ax.set_ylabel("ms per token (median)")
    ax = axes[len(batches)]
    for name in ("tnn dense", "tnn fd", "tnn dense (exact)", "llama", "gpt2"):
        ax.plot(contexts, [get[(name, batches[-1], c)]["state_bytes"] / 2**20 for c in contexts], marker="o",
                label=name)
    ax.set_title(f"decoding state, batch {batches[-1]}")
    ax.set_ylabel("MiB")
    for ax in axes[: len(batches) + 1]:
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("context length")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    ax = axes[-1]
    for mixer, mode in dict.fromkeys((e["mixer"], e["mode"]) for e in errors):
        row = sorted((e for e in errors if e["mixer"] == mixer and e["mode"] == mode), key=lambda e: e["multiple"])
        ax.plot([e["multiple"] for e in row], [max(e["relative_error"], 1e-9) for e in row], marker="o",
                label=f"{mixer} {mode}")
    ax.axhline(1e-4, color="grey", linestyle="--", linewidth=1)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("context / etsc_length")
    ax.set_ylabel("relative max logit error")
    ax.set_title("cached decoding vs no-cache forward")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.suptitle("TNN decoding (generation_cache='auto') against GPT-2 and Llama KV caches, one thread")
    save_figure(fig, path)


if __name__ == "__main__":
    main()
