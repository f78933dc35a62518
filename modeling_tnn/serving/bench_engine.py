"""The vLLM side of the serving benchmark (:mod:`~modeling_tnn.recipes.benchmarks.serving`), run in vLLM's venv:
``python -m modeling_tnn.serving.bench_engine spec.json out.json``. One ``LLM`` per model folder, alive together, so
that the cells (concurrency x prompt length) run interleaved across the models and repeated; each cell submits its
requests at once and times them to the last token. Prefix caching is off for both (the cells reuse the same
prompts, so a cached Llama would skip most of its prefill; vLLM has none for recurrent models). Writes, per model,
each cell's wall times, output tokens per second and median time to first token, and the number of requests of
2,048 tokens the engine's state or KV budget holds. It reads the clock itself: the recipes' harness cannot be
imported in vLLM's venv (no train extra)."""

import json
import statistics
import sys
import time


def _generate(llm, prompts, new_tokens):
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    started = time.perf_counter()
    outputs = llm.generate([TokensPrompt(prompt_token_ids=ids) for ids in prompts],
                           SamplingParams(max_tokens=new_tokens, temperature=0, ignore_eos=True), use_tqdm=False)
    seconds = time.perf_counter() - started
    tokens = sum(len(output.outputs[0].token_ids) for output in outputs)
    first = [output.metrics.first_token_latency for output in outputs
             if getattr(output, "metrics", None) is not None and output.metrics.first_token_latency]
    return seconds, tokens, (statistics.median(first) if first else None)


def _capacity(llm, context: int) -> int | None:
    """Requests of ``context`` tokens the engine's cache holds: state slots (one per request) for a recurrent model,
    KV blocks over the blocks one request takes for attention."""
    cache = llm.llm_engine.vllm_config.cache_config
    if not cache.num_gpu_blocks:
        return None
    if llm.llm_engine.vllm_config.model_config.is_attention_free:
        return cache.num_gpu_blocks
    return cache.num_gpu_blocks // -(-context // cache.block_size)


def main(spec_path: str, out_path: str) -> None:
    from vllm import LLM

    spec = json.load(open(spec_path))
    cells, new_tokens = spec["cells"], spec["new_tokens"]
    longest = max(length for _, length in cells) + new_tokens
    engines = {name: LLM(model=folder, trust_remote_code=True, dtype="float32", enforce_eager=True,
                         max_model_len=longest, max_num_seqs=max(c for c, _ in cells), skip_tokenizer_init=True,
                         seed=0, disable_log_stats=False, enable_prefix_caching=False)
               for name, folder in spec["folders"].items()}
    prompts = spec["prompts"]
    for llm in engines.values():  # warm-up: one short request each
        _generate(llm, [prompts[0][:16]], 4)
    results = {name: {"capacity_at": spec["capacity_context"],
                      "capacity": _capacity(llm, spec["capacity_context"]), "cells": {}}
               for name, llm in engines.items()}
    for repeat in range(spec["repeats"]):
        for concurrency, length in cells:
            order = list(engines) if repeat % 2 == 0 else list(reversed(engines))  # neither model always first
            for name in order:
                seconds, tokens, ttft = _generate(engines[name], [p[:length] for p in prompts[:concurrency]],
                                                  new_tokens)
                cell = results[name]["cells"].setdefault(f"{concurrency}x{length}", {"seconds": [], "ttft": []})
                cell["seconds"].append(seconds)
                cell["ttft"].append(ttft)
                cell["output_tokens"] = tokens
    json.dump(results, open(out_path, "w"), indent=1)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
