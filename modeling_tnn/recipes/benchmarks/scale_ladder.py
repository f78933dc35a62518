"""The scale ladder: TNN from 6M to 350M parameters against a Llama of matched parameter count, one command.

Rungs (``--rungs``): ``6M`` (the ``small`` preset at hidden 256, 4 layers, vocabulary 8,192: the decoding
benchmark's model), ``48.7M`` (``wikitext103_lm``, the paper's LM), ``125M`` (that preset at hidden 768, 12 layers)
and ``350M`` (hidden 1024, 24 layers); dropout 0, initial weights. Each against Llama from transformers at the
TNN's width, depth and vocabulary, heads of 64 (as many KV heads: full attention), sdpa, tied embeddings, float32,
its MLP width solved for the TNN's parameter count (:mod:`.reference_models`). One torch thread.

Measured per rung, each rung in a fresh subprocess (its peak resident set is the rung's alone):

* the compact fit: TNN's first cached forward (2 tokens) minus its second, and the plan it gives per layer;
* prefill of ``--prefill_length`` tokens (batch 1, the forward that returns the decoding state);
* decode ms/token at every (batch, context), interleaved rounds, each timed step after an untimed one of the same
  decoder (as in ``generate``), the prefill never timed: TNN with its default cache (``generation_cache="auto"``),
  its state from a short prefill with the token count then set to the context (a fixed-shape state, as the compact
  one, costs a step what its shape says; one whose shape grows is prefilled with min(context, 2,048) tokens);
  Llama with its DynamicCache of random keys and values of the context's length;
* state bytes per sequence: TNN's ``memory_bytes()`` at batch 1 (the sum of ``describe()``'s ``state_bytes``);
  Llama's keys and values (2 x layers x KV heads x head dim x tokens x 4 bytes) at 256 tokens and each context;
* training step (forward with the loss + backward + AdamW step and zero_grad, as ``bench_training``; the parts also
  timed apart) at each ``--lengths`` n, batch max(1, tokens per step // n), rounds interleaving TNN, Llama and Llama
  with a free mixer: the same model and optimizer with its attention call (QK^T, softmax, the weighted sum of V)
  replaced by ``q + k + v`` through transformers' attention interface (every projection keeps its gradient; rotary
  embedding, MLP, norms, embeddings and optimizer unchanged). The free-mixer bound, Llama's step over that one, is
  the most any token mixer could gain over attention at that size;
* memory: parameter bytes, the peak of one warm training step over the resident set before it (gradients, saved
  activations, temporaries; ``VmHWM`` after ``/proc/self/clear_refs``, Linux) and the rung process's ``ru_maxrss``.

:mod:`.scale_ladder_report` evaluates the targets of issue 29 part 5 per rung. Rows a 2-core machine cannot finish
in reasonable time (``Rung.drops``) or whose KV cache exceeds ``--max_kv_gb`` are dropped and listed with the reason.
``--quick``: two tiny rungs (a check that everything runs; the numbers mean nothing).

    python run_scripts/bench_scale_ladder.py                       # make bench-ladder
    python run_scripts/bench_scale_ladder.py --rungs 6M,48.7M --rounds 2
    python run_scripts/bench_scale_ladder.py --quick --output_dir outputs/ladder_quick
"""

from __future__ import annotations

import argparse
import gc
import json
import resource
import subprocess
import sys
import tempfile
import warnings
from pathlib import Path

import torch

from modeling_tnn import TnnForCausalLM, load_preset
from modeling_tnn.modeling_tnn import CACHE_FIELD

from .generation import cache_bytes, kv_cache
from .harness import (CLOCK, DECODE_TOKENS, command_line, consecutive, env_with_package, interleaved, set_threads, time_once,
                      workload)
from .reference_models import baseline_model, count_parameters, matched_mlp_width
from .scale_ladder_rungs import QUICK_RUNGS, RUNGS, Rung
from .scale_ladder_training import train, training_parts

SCRIPT = "run_scripts/bench_scale_ladder.py"
HEAD_DIM = 64
STATE_PREFILL = 2048  # a TNN state whose shape grows is prefilled this far (every state is final by then)
SHORT_PREFILL = 16  # tokens of the prefill that gives a fixed-shape state its final shape
PARTS = ("fit", "prefill", "decode", "training")


# Toy sizes at the lengths the targets name: every table cell and target is filled, in seconds.
QUICK = dict(prefill_length=256, rounds=1)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rungs", default=None, help=f"comma list of {list(RUNGS)} (default: all; --quick: "
                        f"{list(QUICK_RUNGS)})")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds of the decode and training timings")
    parser.add_argument("--prefill_rounds", type=int, default=1)
    parser.add_argument("--lengths", default="512,2048", help="training lengths n")
    parser.add_argument("--contexts", default="256,2048,8192", help="decode prompt lengths")
    parser.add_argument("--batches", default="1,8", help="decode batch sizes")
    parser.add_argument("--prefill_length", type=int, default=2048)
    parser.add_argument("--max_kv_gb", type=float, default=5.0,
                        help="decode rows whose Llama KV cache (whole batch) is larger are dropped (the step's "
                             "concatenation holds it twice)")
    parser.add_argument("--parts", default=",".join(PARTS), help="comma list of what to measure, of "
                        f"{list(PARTS)} (the fit is paid by the first decode state where it is not measured)")
    parser.add_argument("--profile", type=int, default=0, help="N > 0: also the top N operators (self CPU time) of "
                        "one training step at the first length and one batch-1 decode step at 2,048 tokens (or the "
                        "largest context below), TNN and Llama: what a gap is made of")
    parser.add_argument("--quick", action="store_true", help="tiny rungs at toy lengths: checks that it all runs")
    parser.add_argument("--isolate", type=int, default=1, help="1: each rung in a fresh subprocess (its own peak "
                        "resident set); 0: in this process")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output_dir", default="results/bench_scale_ladder")
    parser.add_argument("--rung_worker", default=None, help=argparse.SUPPRESS)  # "rung name:output json path"
    args = parser.parse_args(argv)
    given = vars(args)  # the namespace's own dict: the settings below are rewritten in place
    if args.quick:
        for key, value in QUICK.items():
            if given[key] == parser.get_default(key):
                given[key] = value
    table = QUICK_RUNGS if args.quick else RUNGS
    names = list(table) if args.rungs is None else args.rungs.split(",")
    unknown = [n for n in names if n not in table]
    if unknown:
        raise ValueError(f"--rungs {unknown}: allowed values are {list(table)}" + (" (with --quick)" if args.quick
                                                                                   else ""))
    args.rung_list = [table[n] for n in names]
    args.parts = args.parts.split(",")
    if any(part not in PARTS for part in args.parts):
        raise ValueError(f"--parts {args.parts}: allowed values are {list(PARTS)}")
    for key in ("lengths", "contexts", "batches"):
        given[key] = [int(v) for v in str(given[key]).split(",") if v.strip()]
    if args.rounds < 1 or args.prefill_rounds < 0:
        raise ValueError(f"--rounds must be at least 1 and --prefill_rounds at least 0, got {args.rounds}, "
                         f"{args.prefill_rounds}.")
    return args


# -- models --------------------------------------------------------------------------------------------------------


def tnn_config(rung: Rung):
    return load_preset(rung.preset, dropout=0.0, **rung.overrides)


def llama_sizes(config) -> dict:
    """:func:`.reference_models.baseline_config`'s sizes for the Llama of a TNN config: its width, depth and
    vocabulary, heads of 64, a rotary range past every context."""
    return dict(vocab_size=config.vocab_size, hidden_size=config.hidden_size, layers=config.num_hidden_layers,
                head_dim=HEAD_DIM, positions=1 << 17)


def build_pair(rung: Rung, seed: int) -> tuple[TnnForCausalLM, torch.nn.Module]:
    """The rung's TNN and its Llama of matched parameter count, both at their initial weights, in eval mode."""
    config = tnn_config(rung)
    torch.manual_seed(seed)
    tnn = TnnForCausalLM(config).eval()
    sizes = llama_sizes(config)
    width = matched_mlp_width("llama", "causal", count_parameters(tnn), **sizes)
    torch.manual_seed(seed)
    return tnn, baseline_model("llama", "causal", mlp_width=width, **sizes).eval()


def kv_bytes_per_sequence(llama, tokens: int) -> int:
    """Llama's KV cache per sequence: keys and values of every layer, float32."""
    c = llama.config
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    return 2 * c.num_hidden_layers * c.num_key_value_heads * head_dim * tokens * 4


def describe_llama(llama) -> dict:
    c = llama.config
    return dict(hidden_size=c.hidden_size, layers=c.num_hidden_layers, heads=c.num_attention_heads,
                kv_heads=c.num_key_value_heads, intermediate_size=c.intermediate_size,
                attn_implementation=c._attn_implementation, tie_word_embeddings=c.tie_word_embeddings)


# -- decoding ------------------------------------------------------------------------------------------------------


def tnn_state(model: TnnForCausalLM, batch: int, context: int):
    """TNN's default-cache state of ``batch`` sequences that have seen ``context`` tokens (see the module doc)."""
    vocab = model.config.vocab_size
    for prompt in (min(context, SHORT_PREFILL), min(context, STATE_PREFILL)):
        out = model(input_ids=torch.randint(1, vocab, (batch, prompt)), use_cache=True, logits_to_keep=1)
        cache = getattr(out, CACHE_FIELD)
        if cache.is_compileable:  # every layer's state has its final shape
            break
    cache._seen_tokens = context  # the state of a longer context: same shape, a later position
    return cache


def decode_step(model, cache, batch: int, tokens: int = DECODE_TOKENS):
    """``tokens`` consecutive decode steps on ``cache`` as one call (:func:`~.harness.consecutive`); divide its
    timing by ``tokens`` (``Timing.per``)."""
    token = torch.randint(1, model.config.vocab_size, (batch, 1))

    def step():
        model(input_ids=token, use_cache=True, **{CACHE_FIELD: cache})
    return consecutive(step, tokens)


def decode(args, rung: Rung, tnn, llama, dropped: list) -> list[dict]:
    """Per (context, batch, model): the median ms of a decode step (timed over runs of DECODE_TOKENS consecutive
    steps) and the state's bytes; one context at a time,
    so that only that context's KV caches are held."""
    rows = []
    for context in args.contexts:
        steps = {}
        for batch in args.batches:
            for name, model in (("tnn", tnn), ("llama", llama)):
                key = f"decode {name} {batch} {context}"
                kv = kv_bytes_per_sequence(llama, context) * batch
                reason = rung.drops.get(key) or (
                    f"KV cache {kv / 1e9:.1f} GB over --max_kv_gb {args.max_kv_gb:g}"
                    if name == "llama" and kv > args.max_kv_gb * 1e9 else None)
                if reason:
                    dropped.append(dict(rung=rung.name, row=key, reason=reason))
                    continue
                cache = tnn_state(model, batch, context) if name == "tnn" else kv_cache(model, batch, context)
                steps[name, batch] = (decode_step(model, cache, batch), cache_bytes(cache))
        timings = interleaved({key: workload(step, before=step) for key, (step, _) in steps.items()},
                              rounds=args.rounds, warmup=1, progress=f"{rung.name} decode at {context}")
        timings = {key: timing.per(DECODE_TOKENS) for key, timing in timings.items()}
        for (name, batch), (_, state) in steps.items():
            rows.append(dict(model=name, batch=batch, context=context, ms_per_token=timings[name, batch].median * 1e3,
                             state_bytes=state, state_bytes_per_sequence=state // batch,
                             **timings[name, batch].summary()))
        del steps, timings
        gc.collect()
    return rows


def fit(tnn: TnnForCausalLM) -> dict:
    """The compact fit (first cached forward minus the second, both of 2 tokens) and the plan it chose."""
    ids = torch.ones(1, 2, dtype=torch.long)
    out, first = time_once(lambda: tnn(input_ids=ids, use_cache=True))
    _, second = time_once(lambda: tnn(input_ids=ids, use_cache=True))
    layers = getattr(out, CACHE_FIELD).describe()
    bounds = [layer["error_bound"] for layer in layers if layer["error_bound"] is not None]
    return dict(fit_s=first - second, first_cached_forward_s=first, second_cached_forward_s=second,
                channels=tnn.config.num_hidden_layers * tnn.config.gtu_dim,
                plans=[{key: layer[key] for key in ("plan", "window", "modes", "error_bound")} for layer in layers],
                max_error_bound=max(bounds) if bounds else None)


def prefill(args, rung: Rung, tnn, llama, dropped: list) -> list[dict]:
    """One forward over a ``prefill_length`` prompt that returns the decoding state (batch 1), interleaved rounds."""
    if "prefill" in rung.drops or not args.prefill_rounds:
        dropped.append(dict(rung=rung.name, row="prefill", reason=rung.drops.get("prefill", "--prefill_rounds 0")))
        return []
    ids = torch.randint(1, tnn.config.vocab_size, (1, args.prefill_length))
    work = {name: workload(lambda m=model: m(input_ids=ids, use_cache=True, logits_to_keep=1))
            for name, model in (("tnn", tnn), ("llama", llama))}
    timings = interleaved(work, rounds=args.prefill_rounds, warmup=0, progress=f"{rung.name} prefill")
    return [dict(model=name, tokens=args.prefill_length, seconds=t.median, **t.summary())
            for name, t in timings.items()]


def profile_steps(args, tnn, llama, top: int) -> list[dict]:
    """Per model: torch.profiler's ``top`` operators by self CPU time (ms) of one training step at the first length
    and of one batch-1 decode step (after an unprofiled one of each)."""
    from torch.profiler import ProfilerActivity, profile

    context = max([c for c in args.contexts if c <= STATE_PREFILL] or args.contexts[:1])
    rows = []
    for name, model in (("tnn", tnn), ("llama", llama)):
        model.eval()
        with torch.no_grad():
            cache = tnn_state(model, 1, context) if name == "tnn" else kv_cache(model, 1, context)
            decode_once = decode_step(model, cache, 1)
        model.train()
        n = args.lengths[0]
        select, forward_backward, update = training_parts(model, n, 1, torch.optim.AdamW(model.parameters(), lr=1e-4),
                                                          args.seed, "sdpa" if name == "llama" else None)
        select()
        steps = ((f"decode b1 @{context}, {DECODE_TOKENS} tokens", torch.no_grad()(decode_once)),
                 (f"training step n={n} b1", lambda fb=forward_backward, up=update: (fb(), up())))
        for what, function in steps:
            function()
            with profile(activities=[ProfilerActivity.CPU]) as prof:
                _, seconds = time_once(function)
            events = sorted(prof.key_averages(), key=lambda e: -e.self_cpu_time_total)[:top]
            rows.append(dict(model=name, what=what, seconds=seconds,
                             top_self_cpu_ms={e.key: e.self_cpu_time_total / 1e3 for e in events}))
        model.eval()
    return rows


# -- one rung --------------------------------------------------------------------------------------------------------


def measure_rung(args, rung: Rung) -> dict:
    """Every measurement of one rung, in this process: fit, prefill and decode at the initial weights, then
    training."""
    started = CLOCK()
    tnn, llama = build_pair(rung, args.seed)
    config = tnn.config
    record = dict(rung=rung.name, preset=rung.preset, overrides=rung.overrides, tokens_per_step=rung.tokens,
                  parameters=dict(tnn=count_parameters(tnn), llama=count_parameters(llama)),
                  parameter_bytes=dict(tnn=4 * count_parameters(tnn), llama=4 * count_parameters(llama)),
                  tnn_config=dict(hidden_size=config.hidden_size, layers=config.num_hidden_layers,
                                  vocab_size=config.vocab_size, gtu_dim=config.gtu_dim,
                                  compact_tolerance=config.compact_tolerance),
                  llama_config=describe_llama(llama),
                  llama_kv_bytes_per_sequence={str(t): kv_bytes_per_sequence(llama, t)
                                               for t in sorted({256, *args.contexts})})
    dropped: list[dict] = []
    print(f"{rung.name}: TNN {record['parameters']['tnn']:,} parameters, Llama {record['parameters']['llama']:,} "
          f"(intermediate {llama.config.intermediate_size})", flush=True)
    sections = {}  # seconds of each part: what the ladder's run time is made of

    def run(name, part, *inputs):
        record[name], sections[name] = time_once(lambda: part(*inputs))
        print(f"{rung.name}: {name} in {sections[name]:.0f} s", flush=True)

    record.update(fit=None, prefill=[], decode=[], training=[])
    dropped += [dict(rung=rung.name, row=part, reason="not in --parts") for part in PARTS if part not in args.parts]
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if "fit" in args.parts:
            run("fit", fit, tnn)
        if "prefill" in args.parts:
            run("prefill", prefill, args, rung, tnn, llama, dropped)
        if "decode" in args.parts:
            run("decode", decode, args, rung, tnn, llama, dropped)
    if "training" in args.parts:
        run("training", train, args, rung, tnn, llama, dropped)
    if args.profile:
        run("profile", profile_steps, args, tnn, llama, args.profile)
    record["dropped"] = dropped
    record["section_seconds"] = sections
    record["process_peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    record["seconds"] = round(CLOCK() - started, 1)
    return record


def run_rung(args, rung: Rung, argv: list[str]) -> dict | str:
    """:func:`measure_rung` in a fresh subprocess (``--isolate 1``) or in this process; where the subprocess fails
    (out of memory, say), why, so that the rungs measured before it are still reported."""
    if not args.isolate:
        return measure_rung(args, rung)
    with tempfile.TemporaryDirectory() as folder:
        output = Path(folder) / "rung.json"
        command = [sys.executable, "-m", __spec__.name, *argv, "--rung_worker", f"{rung.name}:{output}"]
        done = subprocess.run(command, env=env_with_package())
        if done.returncode != 0:
            return f"its process failed (exit {done.returncode}; -9: killed, e.g. out of memory)"
        return json.loads(output.read_text())


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse_args(argv)
    set_threads(args.threads)
    if args.rung_worker:
        name, output = args.rung_worker.split(":", 1)
        record = measure_rung(args, next(r for r in args.rung_list if r.name == name))
        Path(output).write_text(json.dumps(record))
        return
    from .scale_ladder_report import report

    started = CLOCK()
    records, failed = [], []
    for rung in args.rung_list:
        record = run_rung(args, rung, argv)
        if isinstance(record, str):
            failed.append(dict(rung=rung.name, row="the whole rung", reason=record))
            print(f"== rung {rung.name}: {record}", flush=True)
            continue
        records.append(record)
        print(f"== rung {rung.name} done in {record['seconds']:.0f} s", flush=True)
    report(args, command_line(SCRIPT, argv), records, started, failed)
    if failed:
        raise SystemExit(f"rung(s) {[f['rung'] for f in failed]} failed; the others are in {args.output_dir}")


if __name__ == "__main__":
    main()
