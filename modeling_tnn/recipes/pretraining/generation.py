"""After pretraining a causal LM: sampled continuations of prompts, and the per-token generation time with the
recurrent cache against a full recompute."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from transformers import (
    PreTrainedTokenizerBase,
)

from ..common.timing import interleaved, workload


@torch.no_grad()
def generate_sample(model: torch.nn.Module, tokenizer: PreTrainedTokenizerBase, prompt: str, max_new_tokens: int,
                    seed: int) -> str:
    """A sampled continuation of ``prompt`` (top-k 40, temperature 0.8), reproducible through ``seed``."""
    device = next(model.parameters()).device
    encoded = tokenizer(prompt, return_tensors="pt").to(device)
    was_training = model.training
    model.eval()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        out = model.generate(**encoded, max_new_tokens=max_new_tokens, do_sample=True, top_k=40, temperature=0.8,
                             pad_token_id=tokenizer.pad_token_id)
    model.train(was_training)
    return tokenizer.decode(out[0], skip_special_tokens=True)


@torch.no_grad()
def time_generation(model: torch.nn.Module, contexts: Sequence[int], new_tokens: int = 8,
                    seed: int = 0) -> list[dict[str, float]]:
    """Per-token generation time (milliseconds, median over ``new_tokens`` greedy tokens) after a context of each
    length, with the model's cache and with a full recompute, through the public API only:

    * cached: ``out = model(input_ids=context, use_cache=True)``, then ``model(input_ids=next_token,
      cache=out.cache)`` per token (``past_key_values=`` on transformers 5.23);
    * no cache: ``model(input_ids=sequence_so_far, use_cache=False)`` per token, the sequence growing by one.

    The contexts are random token ids (the time does not depend on the text). The measurements are the timing
    loop's interleaved rounds (each round times one token of every kind at every length, so that a burst of load
    on a shared machine spreads over all of them), after one untimed round. Returns ``[{"context": n, "cached_ms":
    ..., "no_cache_ms": ..., "speedup": ...}, ...]``."""
    from modeling_tnn.modeling_tnn import CACHE_FIELD  # "cache" on transformers 5.24, "past_key_values" on 5.23

    device = next(model.parameters()).device
    vocab = model.get_input_embeddings().weight.shape[0]
    was_training = model.training
    model.eval()
    generator = torch.Generator().manual_seed(seed)
    state = {}
    for length in contexts:
        ids = torch.randint(0, vocab, (1, length), generator=generator).to(device)
        out = model(input_ids=ids, use_cache=True)
        state[length] = {"cache": getattr(out, CACHE_FIELD), "token": out.logits[:, -1:].argmax(-1), "sequence": ids}

    def cached_token(entry: dict) -> None:
        out = model(input_ids=entry["token"], use_cache=True, **{CACHE_FIELD: entry["cache"]})
        entry["token"] = out.logits[:, -1:].argmax(-1)
        entry["cache"] = getattr(out, CACHE_FIELD)

    def recomputed_token(entry: dict) -> None:
        logits = model(input_ids=entry["sequence"], use_cache=False).logits
        entry["sequence"] = torch.cat([entry["sequence"], logits[:, -1:].argmax(-1)], dim=1)

    workloads = {}
    for length in contexts:
        workloads[length, "cached"] = workload(lambda entry=state[length]: cached_token(entry))
        workloads[length, "full"] = workload(lambda entry=state[length]: recomputed_token(entry))
    timings = interleaved(workloads, rounds=new_tokens, warmup=1)
    model.train(was_training)
    rows = []
    for length in contexts:
        cached_ms = 1e3 * timings[length, "cached"].median
        full_ms = 1e3 * timings[length, "full"].median
        rows.append({"context": length, "cached_ms": cached_ms, "no_cache_ms": full_ms,
                     "speedup": full_ms / max(cached_ms, 1e-9)})
    return rows


def format_generation_table(rows: list[dict[str, float]]) -> str:
    """The :func:`time_generation` rows as a Markdown table."""
    lines = ["| context | ms/token with cache | ms/token without cache (full recompute) | ratio |",
             "|---|---|---|---|"]
    lines += [f"| {r['context']} | {r['cached_ms']:.1f} | {r['no_cache_ms']:.1f} | {r['speedup']:.1f}x |"
              for r in rows]
    return "\n".join(lines)
