"""The models TNN is measured against, in one importable place: a minimal GPT as small-GPT recipes write it,
transformers' GPT-2, Llama and BERT configured at a TNN's width, depth and vocabulary, and the one way parameter
counts are matched (count each shared tensor once, position tables optionally left out; find the size knob whose
model comes closest to a target, building the candidates on the meta device)."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn
from transformers import (
    BertConfig,
    BertForMaskedLM,
    BertForSequenceClassification,
    GPT2Config,
    GPT2LMHeadModel,
    LlamaConfig,
    LlamaForCausalLM,
    PretrainedConfig,
)

# Parameter names of position tables: TNN has none, so matched counts leave them out.
POSITION_TABLES = ("wpe", "position_embeddings", "token_type_embeddings")
BASELINE_CLASSES = {("gpt2", "causal"): GPT2LMHeadModel, ("llama", "causal"): LlamaForCausalLM,
                    ("bert", "masked"): BertForMaskedLM, ("bert", "classify"): BertForSequenceClassification}


def count_parameters(model: torch.nn.Module, skip: tuple[str, ...] = ()) -> int:
    """Parameters, each shared tensor once, leaving out those whose name contains one of ``skip``."""
    seen, total = set(), 0
    for name, p in model.named_parameters():
        if id(p) in seen or any(s in name for s in skip):
            continue
        seen.add(id(p))
        total += p.numel()
    return total


def closest_size(build: Callable[[int], torch.nn.Module], target: int, multiple: int = 1, low: int = 1,
                 high: int = 1 << 16, skip: tuple[str, ...] = ()) -> int:
    """The multiple of ``multiple`` in [low, high] whose ``build(size)`` has the parameter count (``skip`` left out)
    closest to ``target``; ``build`` must grow with its size. A bisection over sizes, each built on meta."""
    def params(units: int) -> int:
        with torch.device("meta"):
            return count_parameters(build(units * multiple), skip)

    lo, hi = max(1, -(-low // multiple)), max(1, high // multiple)
    while hi - lo > 1:
        middle = (lo + hi) // 2
        lo, hi = (middle, hi) if params(middle) <= target else (lo, middle)
    return multiple * min((lo, hi), key=lambda units: abs(params(units) - target))


def baseline_config(kind: str, family: str, *, vocab_size: int, hidden_size: int, layers: int, mlp_width: int,
                    head_dim: int, positions: int, num_labels: int | None = None, bos_token_id: int | None = None,
                    eos_token_id: int | None = None) -> PretrainedConfig:
    """Config of a ``kind`` baseline (``gpt2``, ``llama``, ``bert``) for ``family`` (``causal``, ``masked``,
    ``classify``): tied embeddings, no dropout, sdpa attention with heads of ``head_dim``, an MLP of ``mlp_width``
    and a position table (GPT-2, BERT) or rotary range (Llama) of ``positions``."""
    if (kind, family) not in BASELINE_CLASSES:
        raise ValueError(f"(kind, family) = {(kind, family)}: allowed values are {sorted(BASELINE_CLASSES)}")
    heads = max(1, hidden_size // head_dim)
    if kind == "gpt2":
        return GPT2Config(vocab_size=vocab_size, n_positions=positions, n_embd=hidden_size, n_layer=layers,
                          n_head=heads, n_inner=mlp_width, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                          tie_word_embeddings=True, bos_token_id=bos_token_id, eos_token_id=eos_token_id,
                          attn_implementation="sdpa")
    if kind == "llama":
        return LlamaConfig(vocab_size=vocab_size, hidden_size=hidden_size, intermediate_size=mlp_width,
                           num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=heads,
                           tie_word_embeddings=True, max_position_embeddings=positions, attn_implementation="sdpa")
    config = BertConfig(vocab_size=vocab_size, hidden_size=hidden_size, num_hidden_layers=layers,
                        num_attention_heads=heads, intermediate_size=mlp_width, max_position_embeddings=positions,
                        hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, tie_word_embeddings=True,
                        attn_implementation="sdpa", type_vocab_size=1 if family == "classify" else 2)
    if num_labels is not None:
        config.num_labels = num_labels
    return config


def baseline_model(kind: str, family: str, **sizes) -> torch.nn.Module:
    """The ``kind`` baseline for ``family`` built from :func:`baseline_config` (``sizes``: its keyword arguments)."""
    return BASELINE_CLASSES[kind, family](baseline_config(kind, family, **sizes))


def matched_mlp_width(kind: str, family: str, target: int, **sizes) -> int:
    """The MLP width whose ``kind`` baseline (``sizes``: :func:`baseline_config`'s other arguments) has the
    parameter count closest to ``target``, position tables left out."""
    return closest_size(lambda width: baseline_model(kind, family, mlp_width=width, **sizes), target,
                        skip=POSITION_TABLES)


class MinimalGpt(nn.Module):
    """A GPT as small-GPT recipes write it: token and position tables, pre-norm blocks of one fused qkv projection
    with causal scaled-dot-product attention and a GELU MLP of 4x width, bias-free Linears and LayerNorms, the output
    projection tied to the token table; the loss of each position predicting the next token."""

    def __init__(self, vocab_size: int, block: int, width: int, layers: int, heads: int):
        super().__init__()
        self.heads = heads
        self.token_table = nn.Embedding(vocab_size, width)
        self.position_table = nn.Embedding(block, width)
        self.blocks = nn.ModuleList(nn.ModuleDict(dict(
            attention_norm=nn.LayerNorm(width, bias=False), qkv=nn.Linear(width, 3 * width, bias=False),
            attention_out=nn.Linear(width, width, bias=False), mlp_norm=nn.LayerNorm(width, bias=False),
            mlp_in=nn.Linear(width, 4 * width, bias=False), mlp_out=nn.Linear(4 * width, width, bias=False)))
            for _ in range(layers))
        self.final_norm = nn.LayerNorm(width, bias=False)
        self.head = nn.Linear(width, vocab_size, bias=False)
        self.head.weight = self.token_table.weight
        self.config = type("Sizes", (), dict(vocab_size=vocab_size))()

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor, **_) -> MinimalGptOutput:
        b, n = input_ids.shape
        x = self.token_table(input_ids) + self.position_table(torch.arange(n, device=input_ids.device))
        for block in self.blocks:
            q, k, v = block["qkv"](block["attention_norm"](x)).view(b, n, 3, self.heads, -1).permute(2, 0, 3, 1, 4)
            attended = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, n, -1)
            x = x + block["attention_out"](attended)
            x = x + block["mlp_out"](F.gelu(block["mlp_in"](block["mlp_norm"](x))))
        logits = self.head(self.final_norm(x))
        loss = F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), labels[:, 1:].reshape(-1))
        return MinimalGptOutput(loss)


class MinimalGptOutput:
    """What the benchmarks read of a forward: the loss."""

    def __init__(self, loss: torch.Tensor):
        self.loss = loss
