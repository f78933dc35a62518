"""The scale ladder's training measurements (:mod:`.scale_ladder` runs them): one training step of TNN, of Llama and
of Llama with a free mixer (its attention call costing nothing, registered in transformers' attention interface as
``FREE_MIXER``), interleaved rounds, and the peak of one warm step over the resident set before it."""

from __future__ import annotations

import gc
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from transformers import AttentionInterface

from .harness import interleaved, status_kb, workload

if TYPE_CHECKING:
    from .scale_ladder_rungs import Rung

FREE_MIXER = "free_mixer"  # the attention-interface name of the zero-cost attention


def free_attention(module, query, key, value, attention_mask, **kwargs):
    """Attention costing nothing: ``q + k + v`` in the layout attention returns (batch, n, heads, head dim), so that
    every projection keeps its gradient; no scores, no softmax, no mask."""
    return (query + key + value).transpose(1, 2), None


AttentionInterface.register(FREE_MIXER, free_attention)


def peak_over(baseline: int | None) -> float | None:
    """MB of the high-water mark over ``baseline`` (kB, from :func:`peak_reset`), at least 0: the kernel keeps
    per-thread resident-set counts that it folds in lazily, so a call that grows nothing can read a few hundred kB
    below its baseline (measured: -0.08 MB)."""
    return None if baseline is None else max(0.0, (status_kb("VmHWM") - baseline) / 1024)


def peak_reset() -> int | None:
    """Reset the kernel's high-water mark of this process to its resident set; the resident set in kB (None where
    the reset is refused: no per-step peak then)."""
    gc.collect()
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return status_kb("VmRSS")
    except (OSError, RuntimeError):
        return None


def training_parts(model, n: int, batch: int, optimizer, seed: int, attention: str | None = None):
    """(select, forward with the loss + backward, AdamW step + zero_grad) for a batch of random ids; ``select``
    (untimed, before each step) sets the attention implementation ``attention`` names (Llama only)."""
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, model.config.vocab_size, (batch, n), generator=generator)

    def select():
        if attention is not None and model.config._attn_implementation != attention:
            model.set_attn_implementation(attention)

    def forward_backward():
        model(input_ids=ids, labels=ids, use_cache=False).loss.backward()

    def update():
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return select, forward_backward, update


def train(args, rung: Rung, tnn, llama, dropped: list) -> list[dict]:
    """Per n and model (TNN, Llama, Llama with a free mixer): the step's timings and peak over the resident set."""
    rows = []
    models = {"tnn": (tnn, None), "llama": (llama, "sdpa"), "llama free mixer": (llama, FREE_MIXER)}
    optimizers = {id(m): torch.optim.AdamW(m.parameters(), lr=1e-4) for m, _ in models.values()}
    for model, _ in models.values():
        model.train()
    lengths = [n for n in args.lengths if f"train {n}" not in rung.drops]
    dropped += [dict(rung=rung.name, row=f"train {n}", reason=rung.drops[f"train {n}"]) for n in args.lengths
                if f"train {n}" in rung.drops]
    primed = set()
    for n in lengths:
        batch = max(1, rung.tokens // n)
        work, peaks = {}, {}
        for name, (model, attention) in models.items():
            select, forward_backward, update = training_parts(model, n, batch, optimizers[id(model)], args.seed,
                                                              attention)
            select()
            if id(model) not in primed:  # AdamW's state exists before any step is measured
                forward_backward(), update()
                primed.add(id(model))
            baseline = peak_reset()  # the warm-up step, measured for its peak
            forward_backward(), update()
            peaks[name] = peak_over(baseline)
            work[name] = workload(forward_backward, update, names=("forward_backward", "optimizer"), before=select)
        timings = interleaved(work, rounds=args.rounds, warmup=0, progress=f"{rung.name} training n={n}")
        for name, timing in timings.items():
            rows.append(dict(model=name, n=n, batch=batch, step_ms=timing.median * 1e3,
                             tokens_per_s=batch * n / timing.median, step_peak_mb=peaks[name], **timing.summary()))
        del work
        gc.collect()
    llama.set_attn_implementation("sdpa")
    for model, _ in models.values():
        model.eval()
    return rows
