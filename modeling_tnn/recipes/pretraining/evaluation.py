"""Language-model evaluation: token-weighted loss and perplexity, and the length-extrapolation evaluation (full or
sliding windows) with its plot."""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from accelerate import Accelerator
from torch.utils.data import DataLoader
from transformers import (
    DataCollatorForLanguageModeling,
    PreTrainedTokenizerBase,
)


def perplexity(loss: float) -> float:
    """``exp(loss)``, ``inf`` on overflow."""
    try:
        return math.exp(loss)
    except OverflowError:
        return float("inf")


def token_loss_sums(logits: torch.Tensor, labels: torch.Tensor, shift: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row sums of the token cross-entropy and the number of scored tokens (labels != -100); ``shift`` scores
    token t+1 from position t (causal LM)."""
    if shift:
        logits, labels = logits[:, :-1], labels[:, 1:]
    losses = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), labels.reshape(-1), ignore_index=-100,
                             reduction="none").view(labels.shape)
    scored = labels != -100
    return (losses * scored).sum(dim=1), scored.sum(dim=1)


class InputBuilder:
    """Turns a batch of token blocks into model inputs: causal LM labels are the inputs (the model shifts them);
    masked LM inputs go through ``DataCollatorForLanguageModeling`` here, in the training step rather than in the
    DataLoader, so its random masks come from the global RNG in step order (Accelerate's DataLoader reads one batch
    ahead, which would make a resumed run mask differently)."""

    def __init__(self, task: str, tokenizer: PreTrainedTokenizerBase, mlm_probability: float | None):
        self.task = task
        self.collator = (DataCollatorForLanguageModeling(tokenizer, mlm=True, mlm_probability=mlm_probability)
                         if task == "mlm" else None)

    def __call__(self, batch: dict[str, torch.Tensor]) -> dict[str, Any]:
        ids = batch["input_ids"]
        # --packing documents: the positions mark the documents; a document's first token is never predicted from
        # the previous document (DataCollatorWithFlattening's rule)
        packed = {"position_ids": batch["position_ids"]} if "position_ids" in batch else {}
        if self.collator is None:  # a causal LM: no generation cache when scoring whole blocks
            labels = ids.masked_fill(batch["position_ids"] == 0, -100) if packed else ids
            return {"input_ids": ids, "labels": labels, "use_cache": False, **packed}
        rows = [{"input_ids": row.cpu(), "special_tokens_mask": mask.cpu()}
                for row, mask in zip(ids, batch["special_tokens_mask"])]
        masked = self.collator(rows)
        return {"input_ids": masked["input_ids"].to(ids.device), "labels": masked["labels"].to(ids.device), **packed}


@torch.no_grad()
def evaluate(model: torch.nn.Module, dataloader: DataLoader, accelerator: Accelerator, build_inputs: InputBuilder,
             seed: int) -> dict[str, float]:
    """Token-weighted validation loss and perplexity over all processes. Masked-LM masks are drawn from a forked RNG
    seeded with ``seed``: the same masks at every evaluation, and the training RNG is left untouched."""
    model.eval()
    sums, counts = [], []
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        for batch in dataloader:
            inputs = build_inputs(batch)
            labels = inputs.pop("labels")
            logits = model(**inputs).logits
            row_sums, row_counts = token_loss_sums(logits, labels, shift=build_inputs.task == "clm")
            row_sums, row_counts = accelerator.gather_for_metrics((row_sums, row_counts))
            sums.append(row_sums.double().cpu())
            counts.append(row_counts.cpu())
    model.train()
    loss = (torch.cat(sums).sum() / torch.cat(counts).sum().clamp(min=1)).item()
    return {"eval_loss": loss, "perplexity": perplexity(loss)}


def position_limit(model: torch.nn.Module) -> int | None:
    """The longest input a model's position table allows (``None`` for TNN, which has none)."""
    return getattr(model.config, "max_position_embeddings", None)


@torch.no_grad()
def evaluate_lengths(model: torch.nn.Module, stream: torch.Tensor, lengths: Iterable[int], *, window: int | None = None,
                     batch_size: int = 4, build_inputs: InputBuilder | None = None, seed: int = 0,
                     max_tokens: int | None = None) -> dict[int, dict[str, Any]]:
    """Validation loss/perplexity at each evaluation length L.

    The token ``stream`` is cut to a multiple of the longest L (and at most ``max_tokens`` rounded up to one), so
    every L scores the same text, then split into segments of L tokens. ``window=None`` reads each segment whole
    (a "full window"); otherwise a sliding window of ``window`` tokens with stride ``window // 2`` scores each
    token once, conditioned on up to ``window - 1`` earlier tokens of its segment (the standard way to evaluate a
    model whose position table is shorter than L). A causal model is scored on next-token prediction; with a masked-LM
    ``build_inputs`` each segment is masked with a fixed seed (full windows only).
    """
    lengths = sorted(set(lengths))
    longest = lengths[-1]
    usable = len(stream) // longest * longest
    if max_tokens:
        usable = min(usable, max(longest, math.ceil(max_tokens / longest) * longest))
    if usable == 0:
        raise ValueError(f"The evaluation stream ({len(stream)} tokens) is shorter than the longest length {longest}.")
    masked = build_inputs is not None and build_inputs.task == "mlm"
    if masked and window is not None:
        raise ValueError("Sliding-window evaluation is for causal models only.")
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    results: dict[int, dict[str, Any]] = {}
    for length in lengths:
        segments = stream[:usable].view(-1, length)
        total, count = torch.zeros((), dtype=torch.float64), 0
        sliding = window is not None and window < length
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            for rows in segments.split(batch_size):
                rows = rows.to(device)
                if masked:
                    inputs = build_inputs({"input_ids": rows, "special_tokens_mask": torch.zeros_like(rows)})
                    row_sums, row_counts = token_loss_sums(model(input_ids=inputs["input_ids"]).logits,
                                                           inputs["labels"], shift=False)
                    total += row_sums.double().sum().cpu()
                    count += int(row_counts.sum())
                    continue
                for start, end, first in _windows(length, window if sliding else length):
                    labels = rows[:, start:end].clone()
                    labels[:, : first - start] = -100  # tokens an earlier window already scored
                    logits = model(input_ids=rows[:, start:end], use_cache=False).logits
                    row_sums, row_counts = token_loss_sums(logits, labels, shift=True)
                    total += row_sums.double().sum().cpu()
                    count += int(row_counts.sum())
        loss = (total / max(count, 1)).item()
        results[length] = {"loss": loss, "perplexity": perplexity(loss), "tokens": count,
                           "mode": f"sliding window {window}, stride {max(1, window // 2)}" if sliding else "full"}
    model.train(was_training)
    return results


def _windows(length: int, window: int) -> Iterator[tuple[int, int, int]]:
    """``(start, end, first_scored_input_position)`` of the windows covering one segment; the labels of positions
    below ``first`` are ignored (with the causal shift, the token at ``first`` is the first one not scored yet)."""
    stride = max(1, window // 2)
    start, scored_upto = 0, 0  # scored_upto: every target position < scored_upto has been scored
    while True:
        end = min(start + window, length)
        yield start, end, max(start, scored_upto)
        scored_upto = end
        if end == length:
            return
        start += stride


def plot_lengths(curves: dict[str, dict[int, float]], path: str | Path, train_length: int | None = None,
                 title: str = "Validation perplexity vs evaluation length") -> None:
    """Plot ``{label: {length: perplexity}}`` on a log2 length axis and save a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for label, points in curves.items():
        xs = sorted(points)
        ax.plot(xs, [points[x] for x in xs], marker="o", label=label)
    if train_length:
        ax.axvline(train_length, color="grey", linestyle=":", label="training length")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("evaluation length (tokens)")
    ax.set_ylabel("validation perplexity")
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
