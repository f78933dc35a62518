#!/usr/bin/env python
"""Per-token decode latency and cache memory against context length, and the ETSC error past its horizon.

Decoders: TNN with the ETSC cache, TNN with the exact cache (dense: the history of mixer inputs; FD: a fixed
window), TNN without a cache (a full recompute per token), and GPT-2 (transformers' GPT2LMHeadModel with its KV
cache; same width, depth and vocabulary, position table sized to fit). For each context length the state is built
by one prefill, then single-token steps are timed; rounds interleave all decoders, medians are reported.

    python run_scripts/bench_generation.py --output_dir results/bench_generation
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch
from tqdm.auto import tqdm
from transformers import GPT2Config, GPT2LMHeadModel

from modeling_tnn import TnnForCausalLM, load_preset
from modeling_tnn.modeling_tnn import CACHE_FIELD


def tnn(args, mixer: str) -> TnnForCausalLM:
    config = load_preset("small", token_mixer=mixer, hidden_size=args.hidden_size,
                         num_hidden_layers=args.num_layers, vocab_size=args.vocab_size, dropout=0.0,
                         etsc_length=args.etsc_length, fd_kernel_length=args.etsc_length)
    return TnnForCausalLM(config).eval()


def gpt2(args, max_context: int) -> GPT2LMHeadModel:
    config = GPT2Config(vocab_size=args.vocab_size, n_positions=max_context + 16, n_embd=args.hidden_size,
                        n_layer=args.num_layers, n_head=max(1, args.hidden_size // 64), resid_pdrop=0.0,
                        embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=None, eos_token_id=None)
    return GPT2LMHeadModel(config).eval()


def cache_bytes(cache) -> int:
    if hasattr(cache, "memory_bytes"):
        return cache.memory_bytes()
    return sum(t.numel() * t.element_size() for layer in cache.layers for t in (layer.keys, layer.values))


def decoder(name: str, model, context: int, vocab: int):
    """(step closure, memory in bytes) for one decoder at one context length."""
    ids = torch.randint(1, vocab, (1, context))
    token = torch.randint(1, vocab, (1, 1))
    if name == "no cache":
        def step():
            model(input_ids=ids)
        return step, 0
    kwargs = {"generation_cache": "exact" if name.startswith("exact") else "etsc"} if name != "gpt2" else {}
    with torch.no_grad():
        out = model(input_ids=ids, use_cache=True, **kwargs)
    cache = getattr(out, CACHE_FIELD)

    def step():
        model(input_ids=token, use_cache=True, **{CACHE_FIELD: cache})
    return step, cache_bytes(cache)


def latency(args) -> list[dict]:
    contexts = [int(c) for c in args.contexts.split(",")]
    models = {"etsc (dense)": tnn(args, "dense"), "etsc (fd)": tnn(args, "fd"), "exact (dense)": None,
              "exact (fd)": None, "no cache": None, "gpt2": gpt2(args, max(contexts))}
    models["exact (dense)"] = models["no cache"] = models["etsc (dense)"]
    models["exact (fd)"] = models["etsc (fd)"]
    results = []
    with torch.no_grad():
        # All (context, decoder) pairs are built first and timed in interleaved rounds, so load that varies over
        # time hits every context alike and the flatness ratio t(8192) / t(256) compares like with like.
        steps = {(name, context): decoder(name, model, context, args.vocab_size)
                 for context in tqdm(contexts, desc="prefill") for name, model in models.items()}
        for step, _ in steps.values():
            step()  # warm-up
        times = {key: [] for key in steps}
        for _ in tqdm(range(args.rounds), desc="interleaved rounds"):
            for key, (step, _) in steps.items():
                start = time.perf_counter()
                step()
                times[key].append(time.perf_counter() - start)
        for (name, context), (_, memory) in steps.items():
            results.append(dict(decoder=name, context=context, median_ms=1000 * statistics.median(times[(name, context)]),
                                cache_bytes=memory))
    return results


def horizon_error(args) -> list[dict]:
    """Max |logit error| of cached decoding against the full recompute, at 1x, 2x and 4x the conversion length."""
    rows = []
    with torch.no_grad():
        for mixer in ("dense", "fd"):
            model = tnn(args, mixer)
            for mode in ("etsc", "exact"):
                for multiple in (1, 2, 4):
                    total = multiple * args.etsc_length
                    ids = torch.randint(1, args.vocab_size, (1, total))
                    prompt, tail = ids[:, : total - args.error_tokens], ids[:, total - args.error_tokens:]
                    out = model(input_ids=prompt, use_cache=True, generation_cache=mode)
                    cache = getattr(out, CACHE_FIELD)
                    decoded = [model(input_ids=tail[:, i:i + 1], **{CACHE_FIELD: cache}).logits[:, -1]
                               for i in range(tail.shape[1])]
                    full = model(input_ids=ids).logits[0, -args.error_tokens:]
                    error = (torch.cat(decoded) - full).abs()
                    rows.append(dict(mixer=mixer, mode=mode, context=total, multiple=multiple,
                                     max_abs_error=error.max().item(),
                                     relative_error=(error.max() / full.abs().max()).item()))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--contexts", default="256,512,1024,2048,4096,8192")
    parser.add_argument("--hidden_size", type=int, default=256)
    parser.add_argument("--num_layers", type=int, default=4)
    parser.add_argument("--vocab_size", type=int, default=8192)
    parser.add_argument("--etsc_length", type=int, default=512)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--error_tokens", type=int, default=8, help="decoded tokens compared in the horizon test")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--output_dir", default="results/bench_generation")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    results = latency(args)
    errors = horizon_error(args)

    contexts = sorted({r["context"] for r in results})
    names = list(dict.fromkeys(r["decoder"] for r in results))
    get = {(r["decoder"], r["context"]): r for r in results}
    lines = ["| context | " + " | ".join(f"{n} ms" for n in names) + " | etsc (dense) cache MB | gpt2 cache MB |",
             "|---" * (len(names) + 3) + "|"]
    for c in contexts:
        lines.append(f"| {c} | " + " | ".join(f"{get[(n, c)]['median_ms']:.2f}" for n in names)
                     + f" | {get[('etsc (dense)', c)]['cache_bytes'] / 2**20:.1f}"
                     + f" | {get[('gpt2', c)]['cache_bytes'] / 2**20:.1f} |")
    table = "\n".join(lines)
    err_lines = ["| mixer | cache | context (x conversion length) | max abs logit error | relative |", "|---|---|---|---|---|"]
    for e in errors:
        err_lines.append(f"| {e['mixer']} | {e['mode']} | {e['context']} ({e['multiple']}x) | "
                         f"{e['max_abs_error']:.2e} | {e['relative_error']:.2e} |")
    err_table = "\n".join(err_lines)
    summary = {}
    if {256, 4096, 8192} <= set(contexts):
        etsc = {c: get[("etsc (dense)", c)]["median_ms"] for c in contexts}
        summary = dict(
            etsc_8192_over_256=etsc[8192] / etsc[256],
            no_cache_over_etsc_at_4096=get[("no cache", 4096)]["median_ms"] / etsc[4096],
            gpt2_over_etsc_at_8192=get[("gpt2", 8192)]["median_ms"] / etsc[8192],
            etsc_memory_constant=len({get[("etsc (dense)", c)]["cache_bytes"] for c in contexts}) == 1,
        )

    out = Path(args.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    meta = dict(command="python run_scripts/bench_generation.py " + " ".join(
        f"--{k} {v}" for k, v in vars(args).items() if v is not None), torch=torch.__version__,
        threads=torch.get_num_threads())
    (out / "results.json").write_text(json.dumps(dict(meta=meta, summary=summary, latency=results,
                                                      horizon_error=errors), indent=1))
    (out / "table.md").write_text(table + "\n\n" + err_table + "\n")
    plot(results, names, contexts, out / "latency.png")
    print(table, "\n\n" + err_table)
    print("summary:", json.dumps(summary, indent=1))
    print(f"wrote {out}/results.json, table.md, latency.png")


def plot(results, names, contexts, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    get = {(r["decoder"], r["context"]): r for r in results}
    fig, (ax_t, ax_m) = plt.subplots(1, 2, figsize=(13, 5))
    for name in names:
        ax_t.plot(contexts, [get[(name, c)]["median_ms"] for c in contexts], marker="o", label=name)
        if name not in ("no cache",):
            ax_m.plot(contexts, [get[(name, c)]["cache_bytes"] / 2**20 for c in contexts], marker="o", label=name)
    for ax, label in ((ax_t, "per-token latency (ms, median)"), (ax_m, "cache memory (MiB)")):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("context length")
        ax.set_ylabel(label)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle("TNN decoding: ETSC cache vs exact cache vs full recompute vs GPT-2 KV cache (batch 1)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    main()
