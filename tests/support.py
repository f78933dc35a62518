"""Helpers the tests share (fixtures live in conftest.py): the project root, the mixers, tiny configs, the data
folder, the bytes autograd saves, run_scripts/ modules by path, and the extractive-QA recipe answers are checked
with."""

from __future__ import annotations

import os
import runpy
from collections.abc import Callable
from pathlib import Path

import torch

from modeling_tnn import load_preset

PROJECT_ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = PROJECT_ROOT / "run_scripts"
# Token mixers available to every model class; causal classes use CAUSAL_MIXERS (SKI is bidirectional only).
MIXERS = ("dense", "fd", "ski")
CAUSAL_MIXERS = tuple(m for m in MIXERS if m != "ski")


def script_main(name: str) -> Callable:
    """The ``main`` of ``run_scripts/<name>.py``, run as a module rather than as ``__main__`` (no ``sys.path`` edit:
    the scripts import only the package)."""
    return runpy.run_path(str(SCRIPTS / f"{name}.py"))["main"]


def tiny_config(token_mixer: str = "dense", **overrides):
    """The tiny preset in float32 with no dropout, so that outputs are deterministic."""
    values = {"token_mixer": token_mixer, "dropout": 0.0, "pad_token_id": 0}
    values.update(overrides)
    return load_preset("tiny", **values)


def data_dir() -> Path | None:
    """``$TNN_DATA_DIR`` or the ``shared/data`` folder laid beside the project, if present."""
    candidates = [os.environ.get("TNN_DATA_DIR"), PROJECT_ROOT.parent / "shared" / "data"]
    for candidate in candidates:
        if candidate and Path(candidate).is_dir():
            return Path(candidate)
    return None


def saved_bytes(function) -> int:
    """Bytes of the tensors autograd saves for backward while ``function()`` runs."""
    total = 0

    def pack(tensor):
        nonlocal total
        total += tensor.numel() * tensor.element_size()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        function()
    return total


def head_scores(output) -> torch.Tensor:
    """One tensor per model output: its logits, or a question-answering head's start and end logits stacked on a last
    axis."""
    return output.logits if hasattr(output, "logits") else torch.stack([output.start_logits, output.end_logits], -1)


def answer_span(start_logits: torch.Tensor, end_logits: torch.Tensor, sequence_ids: list) -> tuple[int, int]:
    """Token indices of the best start, then of the best end at or after it, both inside the context (sequence 1)."""
    outside = torch.tensor([s != 1 for s in sequence_ids])
    start = int(start_logits.masked_fill(outside, float("-inf")).argmax())
    end = start + int(end_logits[start:].masked_fill(outside[start:], float("-inf")).argmax())
    return start, end


def extract_answer(model, tokenizer, question: str, context: str) -> str:
    """The README's extractive-QA recipe: encode with offsets, pick the span, cut it out of the context."""
    enc = tokenizer(question, context, return_offsets_mapping=True, return_tensors="pt")
    offsets = enc.pop("offset_mapping")[0]
    with torch.no_grad():
        out = model(**enc)
    start, end = answer_span(out.start_logits[0], out.end_logits[0], enc.sequence_ids(0))
    return context[int(offsets[start, 0]):int(offsets[end, 1])]
