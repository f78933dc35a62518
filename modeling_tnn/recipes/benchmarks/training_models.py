"""The training benchmark's models and steps (:mod:`.training` times them, :mod:`.training_report` reports them):
each suite's jobs, the TNN of a job, its attention baseline at a matched parameter count, the optimizer and one
training step of random ids."""

from __future__ import annotations

import argparse

import torch

from modeling_tnn import TnnForCausalLM, TnnForMaskedLM, TnnForSequenceClassification, load_preset

from .reference_models import (
    POSITION_TABLES,
    MinimalGpt,
    baseline_model,
    count_parameters,
    matched_mlp_width,
)

SUITES = {
    "lm": {"causal": ["tnn-dense", "tnn-fd", "gpt2", "llama"], "masked": ["tnn-dense", "tnn-fd", "tnn-ski", "bert"]},
    "lra": {"classify": ["tnn-dense", "tnn-fd", "tnn-ski", "bert"]},
    "small_gpt": {"causal": ["tnn-dense", "tnn-fd", "gpt2", "mingpt"]},
}
# The small-GPT recipe: its sizes, and the TNN options that bring TNN to about its parameter count.
SMALL_GPT = dict(hidden_size=128, num_hidden_layers=4, vocab_size=65, block=64, batch=12, heads=4)
SMALL_GPT_TNN = dict(glu_expand_ratio=1, rpe_dim=32, rpe_layers=3)
MATCH_TOLERANCE = 0.035


def batch_for(args: argparse.Namespace, n: int) -> int:
    """Sequences per step at length ``n``: ``--tokens`` of them in all, at least one."""
    return max(1, args.tokens // n)


def tnn_config(args: argparse.Namespace, family: str, mixer: str):
    """The TNN config of a job: ``--preset`` with the mixer, the family's direction and the suite's sizes."""
    overrides = dict(token_mixer=mixer, dropout=0.0, causal=family == "causal")
    if args.suite == "small_gpt":
        overrides.update(SMALL_GPT_TNN, num_hidden_layers=SMALL_GPT["num_hidden_layers"],
                         vocab_size=SMALL_GPT["vocab_size"])
    if args.hidden_size:
        overrides["hidden_size"] = args.hidden_size
    if family == "classify":
        overrides["num_labels"] = 10
    return load_preset(args.preset, **overrides)


def baseline_sizes(tnn, width: int, max_n: int, head_dim: int, kind: str) -> dict:
    """:func:`.reference_models.baseline_config`'s sizes for a baseline of the TNN config ``tnn``'s width, depth and
    vocabulary with an MLP of ``width``: GPT-2's position table of ``max_n`` rows, Llama's rotary range of at least
    2048, BERT's table of max(2048, n) rows (the LRA baseline's 2048, longer where n needs it)."""
    positions = max_n if kind == "gpt2" else max(max_n, 2048)
    return dict(vocab_size=tnn.vocab_size, hidden_size=tnn.hidden_size, layers=tnn.num_hidden_layers,
                mlp_width=width, head_dim=head_dim, positions=positions,
                num_labels=tnn.num_labels if kind == "bert" else None,
                # GPT-2's own 50256 is off this vocabulary: the TNN's special tokens instead.
                bos_token_id=tnn.bos_token_id if kind == "gpt2" else None,
                eos_token_id=tnn.eos_token_id if kind == "gpt2" else None)


TNN_CLASSES = {"causal": TnnForCausalLM, "masked": TnnForMaskedLM, "classify": TnnForSequenceClassification}


def matched_width(kind: str, family: str, tnn, target: int, max_n: int, head_dim: int) -> int:
    """The baseline MLP width whose parameter count (position tables left out) is closest to ``target``."""
    sizes = baseline_sizes(tnn, 0, max_n, head_dim, kind)
    del sizes["mlp_width"]
    return matched_mlp_width(kind, family, target, **sizes)


def build(args: argparse.Namespace, family: str, name: str, max_n: int) -> torch.nn.Module:
    torch.manual_seed(args.seed)
    if name.startswith("tnn-"):
        model = TNN_CLASSES[family](tnn_config(args, family, name[4:]))
    elif args.suite == "small_gpt":  # the recipe's own sizes, not matched to TNN
        tnn = tnn_config(args, family, "dense")
        if name == "mingpt":
            model = MinimalGpt(tnn.vocab_size, max_n, tnn.hidden_size, tnn.num_hidden_layers, SMALL_GPT["heads"])
        else:
            model = baseline_model(name, family, **baseline_sizes(tnn, 4 * tnn.hidden_size, max_n, args.head_dim,
                                                                  name))
    else:
        tnn = tnn_config(args, family, "dense")
        with torch.device("meta"):
            target = count_parameters(TNN_CLASSES[family](tnn))
        width = matched_width(name, family, tnn, target, max_n, args.head_dim)
        model = baseline_model(name, family, **baseline_sizes(tnn, width, max_n, args.head_dim, name))
    return model.train()


def make_optimizer(args: argparse.Namespace, model: torch.nn.Module) -> torch.optim.Optimizer:
    """AdamW; in the small-GPT suite as that recipe sets it, for every model: betas (0.9, 0.99), weight decay 0.1
    on the 2-D weights only."""
    if args.suite != "small_gpt":
        return torch.optim.AdamW(model.parameters(), lr=1e-4)
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [dict(params=[p for p in params if p.dim() >= 2], weight_decay=0.1),
              dict(params=[p for p in params if p.dim() < 2], weight_decay=0.0)]
    return torch.optim.AdamW(groups, lr=1e-3, betas=(0.9, 0.99))


def make_step(args: argparse.Namespace, model: torch.nn.Module, family: str, n: int, batch: int, vocab: int,
              seed: int, split: bool = False):
    """A closure running one training step: forward with the loss, backward, AdamW step, gradients dropped. With
    ``split`` it returns two closures instead: forward + backward, and the optimizer's step + zero_grad."""
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab, (batch, n), generator=generator)
    if family == "causal":
        labels = ids
    elif family == "masked":
        labels = torch.full_like(ids, -100)
        chosen = torch.rand(batch, n, generator=generator) < 0.15
        labels[chosen] = ids[chosen]
    else:
        labels = torch.randint(0, 10, (batch,), generator=generator)
    optimizer = make_optimizer(args, model)

    def forward_backward():
        loss = model(input_ids=ids, labels=labels, use_cache=False).loss if family == "causal" else \
            model(input_ids=ids, labels=labels).loss
        loss.backward()

    def update():
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    if split:
        return forward_backward, update

    def step():
        forward_backward()
        update()
    return step


def jobs_of(args: argparse.Namespace) -> list[tuple[str, str]]:
    """The (family, model) pairs to run, each also compiled (``+compile``) with ``--compile``."""
    jobs = [(f, m) for f in args.families for m in SUITES[args.suite][f] if args.models is None or m in args.models]
    return jobs + [(f, m + COMPILED) for f, m in jobs] if args.compile else jobs


COMPILED = "+compile"


def build_job(args: argparse.Namespace, family: str, name: str, max_n: int) -> torch.nn.Module:
    """The model of a job: ``name`` built, compiled (inductor) when it ends with ``+compile``."""
    if name.endswith(COMPILED):
        return torch.compile(build(args, family, name.removesuffix(COMPILED), max_n))
    return build(args, family, name, max_n)


def vocab_of(model: torch.nn.Module) -> int:
    """The vocabulary of a model, compiled or not."""
    return getattr(model, "_orig_mod", model).config.vocab_size


def parameter_counts(args: argparse.Namespace) -> dict[tuple[str, str], tuple[int, float]]:
    """Per job: its parameter count (position tables left out) and its difference to TNN dense, built on meta."""
    max_n = max(args.lengths + args.memory_lengths)
    counts = {}
    for family, name in jobs_of(args):
        base = name.removesuffix(COMPILED)
        with torch.device("meta"):
            tnn_total = count_parameters(TNN_CLASSES[family](tnn_config(args, family, "dense")))
            if base.startswith("tnn-"):
                total = count_parameters(TNN_CLASSES[family](tnn_config(args, family, base[4:])))
            else:
                total = count_parameters(build(args, family, base, max_n), POSITION_TABLES)
        counts[family, name] = (total, total / tnn_total - 1)
        print(f"{family} {name}: {total:,} parameters ({total / tnn_total - 1:+.2%})", flush=True)
        if abs(total / tnn_total - 1) > MATCH_TOLERANCE and args.suite != "small_gpt":
            print(f"  warning: {name} is not within {MATCH_TOLERANCE:.1%} of TNN dense", flush=True)
    return counts
