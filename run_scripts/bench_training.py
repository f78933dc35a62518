#!/usr/bin/env python
"""Whole-model training step (forward + backward + AdamW step) of TNN against attention, at matched size.

TNN (dense, fd; ski in the masked suite) against GPT-2 and Llama (causal LM) and BERT (masked LM) from transformers
with ``attn_implementation="sdpa"``, at a matched parameter count (the baselines' MLP width is solved for it;
position tables are not counted, as TNN has none). One torch thread.

* Throughput: every model and length is built in this one process and timed once per round; the rounds interleave,
  so a burst of load on a shared machine hits every model alike. Medians over rounds, ratios within this run; each
  step's forward + backward and optimizer are also timed apart, to say which of the two a gap is in.
* Peak memory: a fresh subprocess per model and length builds the model, its AdamW optimizer and the batch, reads
  its resident set (VmRSS), resets the kernel's high-water mark (``/proc/self/clear_refs``, falling back to
  ``ru_maxrss`` where that is refused) and runs one training step (the AdamW state is created in it); the peak is
  the high-water mark minus that baseline: activations saved for backward, gradients, the optimizer state and the
  temporaries of one step, not the weights or the interpreter.
* ``--profile``: torch.profiler's top operators of one training step per model and length.
* ``--count_ops``: the number of ``aten::`` events torch.profiler records in one step, forward + backward and the
  optimizer's step separately, per model and length (on an accelerator each is a kernel launch or more).
* ``--compile``: each model also as ``torch.compile(model)`` (inductor), timed in the same interleaved rounds.

Suites: ``lm`` (the default: causal and masked LM models built from ``--preset`` at ``--hidden_size``), ``lra``
(sequence classification at the ``lra_listops`` preset's sizes: bidirectional TNN against BERT for sequence
classification with a position table of max(2048, n) rows) and ``small_gpt`` (a well-known small-GPT recipe's
character model: width 128, 4 layers, block 64, batch 12, a 65-symbol vocabulary, AdamW betas (0.9, 0.99) with
weight decay 0.1 on 2-D weights, for every model; TNN with ``glu_expand_ratio=1, rpe_dim=32, rpe_layers=3``
against transformers' GPT-2 (sdpa) and a minimal GPT written here as such recipes write it, both at the recipe's
own size: 4 heads, a 4x MLP).

    python run_scripts/bench_training.py --output_dir results/bench_training
    python run_scripts/bench_training.py --suite lra --output_dir results/bench_lra_speed
    python run_scripts/bench_training.py --suite small_gpt --output_dir results/bench_training/small_gpt
"""

from __future__ import annotations

import argparse
import gc
import json
import resource
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from param_matching import POSITION_TABLES, closest_size, count_parameters
from torch import nn
from transformers import (
    BertConfig,
    BertForMaskedLM,
    BertForSequenceClassification,
    GPT2Config,
    GPT2LMHeadModel,
    LlamaConfig,
    LlamaForCausalLM,
)

from modeling_tnn import TnnForCausalLM, TnnForMaskedLM, TnnForSequenceClassification, load_preset
from modeling_tnn.ops_dispatch import convolution_policy, current_policy

SUITES = {
    "lm": {"causal": ["tnn-dense", "tnn-fd", "gpt2", "llama"], "masked": ["tnn-dense", "tnn-fd", "tnn-ski", "bert"]},
    "lra": {"classify": ["tnn-dense", "tnn-fd", "tnn-ski", "bert"]},
    "small_gpt": {"causal": ["tnn-dense", "tnn-fd", "gpt2", "mingpt"]},
}
# The small-GPT recipe: its sizes, and the TNN options that bring TNN to about its parameter count.
SMALL_GPT = dict(hidden_size=128, num_hidden_layers=4, vocab_size=65, block=64, batch=12, heads=4)
SMALL_GPT_TNN = dict(glu_expand_ratio=1, rpe_dim=32, rpe_layers=3)
MATCH_TOLERANCE = 0.035


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--suite", choices=sorted(SUITES), default="lm")
    parser.add_argument("--preset", default=None, help="TNN preset (default: small for lm, lra_listops for lra)")
    parser.add_argument("--hidden_size", type=int, default=None, help="override the preset's (lm default: 256)")
    parser.add_argument("--lengths", default=None, help="throughput lengths (lm: 64,128,512,2048,8192; "
                        "lra: 1024,2048,4096)")
    parser.add_argument("--memory_lengths", default=None, help="peak-memory lengths (lm: 512,2048,8192,32768; "
                        "lra: 1024,2048,4096); empty for none")
    parser.add_argument("--head_dim", type=int, default=None, help="width per attention head of the baselines "
                        "(lm: 64; lra: 32, as the ListOps BERT baseline)")
    parser.add_argument("--tokens", type=int, default=8192, help="tokens per step: batch = max(1, tokens // n)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--families", default=None, help="comma list of the suite's families (causal,masked)")
    parser.add_argument("--models", default=None, help="comma list restricting the models, e.g. tnn-dense,llama")
    parser.add_argument("--profile", action="store_true", help="profile one step per model and length instead")
    parser.add_argument("--profile_rows", type=int, default=15)
    parser.add_argument("--output_dir", default=None)
    parser.add_argument("--count_ops", action="store_true", help="count the aten ops of one step instead")
    parser.add_argument("--compile", action="store_true", help="also time torch.compile(model) of every model")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--replot", default=None, help="redraw training.png from this folder's results.json")
    parser.add_argument("--memory_worker", default=None, help=argparse.SUPPRESS)  # "family:model:n:batch"
    args = parser.parse_args(argv)
    lm, small = args.suite == "lm", args.suite == "small_gpt"
    args.preset = args.preset or ("lra_listops" if args.suite == "lra" else "small")
    args.hidden_size = args.hidden_size or (256 if lm else SMALL_GPT["hidden_size"] if small else None)
    args.head_dim = args.head_dim or (64 if lm else args.hidden_size // SMALL_GPT["heads"] if small else 32)
    default_lengths = {"lm": "64,128,512,2048,8192", "lra": "1024,2048,4096", "small_gpt": str(SMALL_GPT["block"])}
    args.lengths = _ints(args.lengths if args.lengths is not None else default_lengths[args.suite])
    default_memory = {"lm": "512,2048,8192,32768", "lra": "1024,2048,4096", "small_gpt": ""}
    args.memory_lengths = _ints(args.memory_lengths if args.memory_lengths is not None else
                                default_memory[args.suite])
    if small and args.tokens == parser.get_default("tokens"):
        args.tokens = SMALL_GPT["batch"] * SMALL_GPT["block"]
    families = list(SUITES[args.suite]) if args.families is None else args.families.split(",")
    unknown = [f for f in families if f not in SUITES[args.suite]]
    if unknown:
        raise ValueError(f"--families {unknown}: allowed values for suite {args.suite!r} are "
                         f"{list(SUITES[args.suite])}")
    args.families = families
    wanted = None if args.models is None else args.models.split(",")
    allowed = sorted({m for f in SUITES[args.suite].values() for m in f})
    if wanted is not None and any(m not in allowed for m in wanted):
        raise ValueError(f"--models {wanted}: allowed values are {allowed}")
    args.models = wanted
    default_dir = {"lm": "bench_training", "lra": "bench_lra_speed", "small_gpt": "bench_training/small_gpt"}
    args.output_dir = Path(args.output_dir or f"results/{default_dir[args.suite]}")
    return args


def _ints(text: str) -> list[int]:
    return [int(v) for v in text.split(",") if v.strip()]


def batch_for(args: argparse.Namespace, n: int) -> int:
    return max(1, args.tokens // n)


# -- models ------------------------------------------------------------------------------------------------------


def tnn_config(args: argparse.Namespace, family: str, mixer: str):
    overrides = dict(token_mixer=mixer, dropout=0.0, causal=family == "causal")
    if args.suite == "small_gpt":
        overrides.update(SMALL_GPT_TNN, num_hidden_layers=SMALL_GPT["num_hidden_layers"],
                         vocab_size=SMALL_GPT["vocab_size"])
    if args.hidden_size:
        overrides["hidden_size"] = args.hidden_size
    if family == "classify":
        overrides["num_labels"] = 10
    return load_preset(args.preset, **overrides)


def baseline_config(kind: str, family: str, tnn, width: int, max_n: int, head_dim: int):
    """Config of a baseline with the TNN's width, depth and vocabulary and an MLP of ``width``."""
    d, layers, vocab = tnn.hidden_size, tnn.num_hidden_layers, tnn.vocab_size
    heads = max(1, d // head_dim)
    if kind == "gpt2":
        return GPT2Config(vocab_size=vocab, n_positions=max_n, n_embd=d, n_layer=layers, n_head=heads, n_inner=width,
                          resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, tie_word_embeddings=True,
                          bos_token_id=tnn.bos_token_id, eos_token_id=tnn.eos_token_id,  # GPT-2's 50256: off-vocab
                          attn_implementation="sdpa")
    if kind == "llama":
        return LlamaConfig(vocab_size=vocab, hidden_size=d, intermediate_size=width, num_hidden_layers=layers,
                           num_attention_heads=heads, num_key_value_heads=heads, tie_word_embeddings=True,
                           max_position_embeddings=max(max_n, 2048), attn_implementation="sdpa")
    # BERT: its position table has max(2048, n) rows (the LRA baseline's 2048, longer where n needs it).
    config = BertConfig(vocab_size=vocab, hidden_size=d, num_hidden_layers=layers, num_attention_heads=heads,
                        intermediate_size=width, max_position_embeddings=max(2048, max_n), hidden_dropout_prob=0.0,
                        attention_probs_dropout_prob=0.0, tie_word_embeddings=True, attn_implementation="sdpa",
                        type_vocab_size=1 if family == "classify" else 2)
    if family == "classify":
        config.num_labels = tnn.num_labels
    return config


BASELINE_CLASSES = {("gpt2", "causal"): GPT2LMHeadModel, ("llama", "causal"): LlamaForCausalLM,
                    ("bert", "masked"): BertForMaskedLM, ("bert", "classify"): BertForSequenceClassification}
TNN_CLASSES = {"causal": TnnForCausalLM, "masked": TnnForMaskedLM, "classify": TnnForSequenceClassification}


def matched_width(kind: str, family: str, tnn, target: int, max_n: int, head_dim: int) -> int:
    """The baseline MLP width whose parameter count (position tables left out) is closest to ``target``."""
    return closest_size(lambda width: BASELINE_CLASSES[kind, family](baseline_config(kind, family, tnn, width, max_n,
                                                                                        head_dim)),
                        target, skip=POSITION_TABLES)


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

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor, **_) -> "MinimalGptOutput":
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
    def __init__(self, loss: torch.Tensor):
        self.loss = loss


def build(args: argparse.Namespace, family: str, name: str, max_n: int) -> torch.nn.Module:
    torch.manual_seed(args.seed)
    if name.startswith("tnn-"):
        model = TNN_CLASSES[family](tnn_config(args, family, name[4:]))
    elif args.suite == "small_gpt":  # the recipe's own sizes, not matched to TNN
        tnn = tnn_config(args, family, "dense")
        if name == "mingpt":
            model = MinimalGpt(tnn.vocab_size, max_n, tnn.hidden_size, tnn.num_hidden_layers, SMALL_GPT["heads"])
        else:
            model = BASELINE_CLASSES[name, family](baseline_config(name, family, tnn, 4 * tnn.hidden_size, max_n,
                                                                   args.head_dim))
    else:
        tnn = tnn_config(args, family, "dense")
        with torch.device("meta"):
            target = count_parameters(TNN_CLASSES[family](tnn))
        width = matched_width(name, family, tnn, target, max_n, args.head_dim)
        model = BASELINE_CLASSES[name, family](baseline_config(name, family, tnn, width, max_n, args.head_dim))
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
    jobs = [(f, m) for f in args.families for m in SUITES[args.suite][f] if args.models is None or m in args.models]
    return jobs + [(f, m + COMPILED) for f, m in jobs] if args.compile else jobs


COMPILED = "+compile"


def build_job(args: argparse.Namespace, family: str, name: str, max_n: int) -> torch.nn.Module:
    """The model of a job: ``name`` built, compiled (inductor) when it ends with ``+compile``."""
    if name.endswith(COMPILED):
        return torch.compile(build(args, family, name.removesuffix(COMPILED), max_n))
    return build(args, family, name, max_n)


def vocab_of(model: torch.nn.Module) -> int:
    return getattr(model, "_orig_mod", model).config.vocab_size


# -- throughput ----------------------------------------------------------------------------------------------------


def throughput(args: argparse.Namespace) -> list[dict]:
    max_n = max(args.lengths + args.memory_lengths)
    models = {(f, m): build_job(args, f, m, max_n) for f, m in jobs_of(args)}
    rows = []
    for n in args.lengths:
        batch = batch_for(args, n)
        steps = {}
        for (family, name), model in models.items():
            forward_backward, update = make_step(args, model, family, n, batch, vocab_of(model), args.seed, split=True)
            forward_backward()  # warm-up (allocator, AdamW state, compilation)
            update()
            steps[family, name] = forward_backward, update
        times = {key: [] for key in steps}
        optimizer_times = {key: [] for key in steps}
        for round_index in range(args.rounds):
            for key, (forward_backward, update) in steps.items():
                start = time.perf_counter()
                forward_backward()
                middle = time.perf_counter()
                update()
                end = time.perf_counter()
                times[key].append(end - start)
                optimizer_times[key].append(end - middle)
            print(f"n={n} round {round_index + 1}/{args.rounds}", flush=True)
        for (family, name), t in times.items():
            median = statistics.median(t)
            optimizer = optimizer_times[family, name]
            rows.append(dict(family=family, model=name, n=n, batch=batch, median_s=median, times_s=t,
                             tokens_per_s=batch * n / median,
                             forward_backward_median_s=statistics.median(a - b for a, b in zip(t, optimizer)),
                             optimizer_median_s=statistics.median(optimizer), optimizer_times_s=optimizer))
        del steps
        gc.collect()
    return rows


# -- peak memory ---------------------------------------------------------------------------------------------------


def _status_kb(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {field}")


def memory_worker(args: argparse.Namespace) -> None:
    family, name, n, batch = args.memory_worker.split(":")
    n, batch = int(n), int(batch)
    model = build_job(args, family, name, max(n, max(args.memory_lengths + args.lengths)))
    step = make_step(args, model, family, n, batch, vocab_of(model), args.seed)
    gc.collect()
    baseline = _status_kb("VmRSS")
    try:
        Path("/proc/self/clear_refs").write_text("5")  # reset VmHWM to the current RSS
        method = "VmHWM after clear_refs"
    except OSError:
        method = "ru_maxrss"
    start = time.perf_counter()
    step()
    seconds = time.perf_counter() - start
    peak = _status_kb("VmHWM") if method.startswith("VmHWM") else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(json.dumps(dict(family=family, model=name, n=n, batch=batch, baseline_mb=baseline / 1024,
                          peak_mb=peak / 1024, step_peak_mb=(peak - baseline) / 1024, step_s=seconds,
                          method=method)))


def memory(args: argparse.Namespace, argv: list[str]) -> list[dict]:
    rows = []
    for n in args.memory_lengths:
        for family, name in jobs_of(args):
            spec = f"{family}:{name}:{n}:{batch_for(args, n)}"
            command = [sys.executable, __file__, *argv, "--memory_worker", spec]
            result = subprocess.run(command, capture_output=True, text=True)
            if result.returncode != 0:
                print(f"memory {spec} failed (rc {result.returncode}): {result.stderr[-400:]}", flush=True)
                rows.append(dict(family=family, model=name, n=n, batch=batch_for(args, n), failed=result.returncode))
                continue
            row = json.loads(result.stdout.strip().splitlines()[-1])
            print(f"memory {spec}: {row['step_peak_mb']:.0f} MB over the baseline ({row['step_s']:.1f} s)", flush=True)
            rows.append(row)
    return rows


# -- profile -------------------------------------------------------------------------------------------------------


def profile(args: argparse.Namespace) -> None:
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    args.output_dir.mkdir(parents=True, exist_ok=True)
    max_n = max(args.lengths)
    for family, name in jobs_of(args):
        model = build_job(args, family, name, max_n)
        for n in args.lengths:
            step = make_step(args, model, family, n, batch_for(args, n), vocab_of(model), args.seed)
            step()
            with torch_profile(activities=[ProfilerActivity.CPU]) as prof:
                start = time.perf_counter()
                step()
                seconds = time.perf_counter() - start
            table = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=args.profile_rows,
                                              max_name_column_width=60)
            text = f"{family} {name} n={n} batch={batch_for(args, n)}: step {seconds:.3f} s (profiled)\n{table}"
            print(text, flush=True)
            (args.output_dir / f"profile_{family}_{name}_{n}.txt").write_text(text)


# -- op counts ------------------------------------------------------------------------------------------------------


def _aten_events(run) -> tuple[int, dict[str, int]]:
    """``run()`` under torch.profiler: the number of ``aten::`` events (every one, nested ones too) and per name."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    with torch_profile(activities=[ProfilerActivity.CPU]) as prof:
        run()
    names: dict[str, int] = {}
    for event in prof.events():
        if event.name.startswith("aten::"):
            names[event.name] = names.get(event.name, 0) + 1
    return sum(names.values()), names


def count_ops(args: argparse.Namespace) -> list[dict]:
    """Per model and length: aten events of forward + backward and of the optimizer step, parameter tensors."""
    rows = []
    max_n = max(args.lengths)
    for family, name in jobs_of(args):
        model = build_job(args, family, name, max_n)
        for n in args.lengths:
            forward_backward, update = make_step(args, model, family, n, batch_for(args, n), vocab_of(model),
                                                 args.seed, split=True)
            forward_backward()  # warm-up: AdamW's state, compilation
            update()
            forward_backward()
            total, names = _aten_events(forward_backward)
            optimizer_total, _ = _aten_events(update)
            # Off CPU the FFT convolution takes all channels in one chunk (on CPU it cuts them into cache-sized
            # chunks, each a few more operators) and a single block as one unchunked FFT: the count as an
            # accelerator would launch it.
            with convolution_policy(current_policy().as_on_accelerator()):
                forward_backward()
                update()
                one_chunk, _ = _aten_events(forward_backward)
            top = dict(sorted(names.items(), key=lambda item: -item[1])[:12])
            tensors = len({id(p) for p in model.parameters()})
            rows.append(dict(family=family, model=name, n=n, batch=batch_for(args, n), forward_backward=total,
                             forward_backward_one_chunk=one_chunk, optimizer=optimizer_total,
                             parameter_tensors=tensors, top=top))
            print(f"{family} {name} n={n}: {total} aten ops forward + backward ({one_chunk} in one channel chunk), "
                  f"{optimizer_total} in the optimizer step, {tensors} parameter tensors", flush=True)
    return rows


def ops_table(rows: list[dict]) -> str:
    lines = ["| family | model | n | batch | aten ops fwd + bwd | same, one channel chunk (as off CPU) | optimizer | "
             "parameter tensors | most frequent |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        top = ", ".join(f"{k.removeprefix('aten::')} {v}" for k, v in list(r["top"].items())[:6])
        lines.append(f"| {r['family']} | {r['model']} | {r['n']} | {r['batch']} | {r['forward_backward']:,} | "
                     f"{r['forward_backward_one_chunk']:,} | {r['optimizer']:,} | {r['parameter_tensors']} | {top} |")
    return "\n".join(lines) + "\n"


# -- report --------------------------------------------------------------------------------------------------------

RATIOS = {
    "lm": [("causal", "tnn-dense", "llama"), ("causal", "tnn-fd", "llama"), ("causal", "tnn-dense", "gpt2"),
           ("causal", "tnn-fd", "gpt2"), ("causal", "tnn-fd", "tnn-dense"), ("masked", "tnn-ski", "bert"),
           ("masked", "tnn-dense", "bert"), ("masked", "tnn-fd", "bert"), ("masked", "tnn-ski", "tnn-dense"),
           ("masked", "tnn-fd", "tnn-dense")],
    "small_gpt": [("causal", "tnn-dense", "gpt2"), ("causal", "tnn-fd", "gpt2"), ("causal", "tnn-dense", "mingpt"),
                  ("causal", "tnn-fd", "mingpt"), ("causal", "tnn-fd", "tnn-dense")],
    "lra": [("classify", "tnn-dense", "bert"), ("classify", "tnn-fd", "bert"), ("classify", "tnn-ski", "bert"),
            ("classify", "tnn-fd", "tnn-dense"), ("classify", "tnn-ski", "tnn-dense")],
}


def ratios(args: argparse.Namespace) -> list[tuple[str, str, str]]:
    """The suite's ratios; with ``--compile`` also compiled against compiled and each model compiled against eager."""
    pairs = list(RATIOS[args.suite])
    if args.compile:
        pairs += [(f, a + COMPILED, b + COMPILED) for f, a, b in RATIOS[args.suite]]
        pairs += [(f, m + COMPILED, m) for f, m in dict.fromkeys((f, m) for f, m in jobs_of(args)
                                                                  if not m.endswith(COMPILED))]
    return pairs


def render(args, counts, speed, peaks) -> str:
    lines = [f"Suite {args.suite}, preset {args.preset}" + (f", hidden {args.hidden_size}" if args.hidden_size else "")
             + f", one torch thread, tokens per step {args.tokens} (batch = max(1, {args.tokens} // n)), "
             f"median of {args.rounds} interleaved rounds.", "", "Parameters (position tables not counted):", ""]
    for (family, name), (total, ratio) in counts.items():
        lines.append(f"- {family} {name}: {total:,} ({ratio:+.2%} vs TNN dense)")
    lengths = sorted({r["n"] for r in speed})
    if speed:
        lines += ["", "Training steps per second (tokens/s in brackets):", "",
                  "| family | model | " + " | ".join(f"n={n}" for n in lengths) + " |",
                  "|---|---|" + "---|" * len(lengths)]
        for family, name in counts:
            cells = []
            for n in lengths:
                row = next((r for r in speed if (r["family"], r["model"], r["n"]) == (family, name, n)), None)
                cells.append("—" if row is None else f"{1 / row['median_s']:.3f} ({row['tokens_per_s']:.0f})")
            lines.append(f"| {family} | {name} | " + " | ".join(cells) + " |")
        lines += ["", "Where a step's time goes (median ms: forward with the loss + backward, and the optimizer's step "
                  "+ zero_grad, timed separately within each step):", "",
                  "| family | model | n | forward + backward | optimizer |", "|---|---|---|---|---|"]
        for row in speed:
            if "optimizer_median_s" in row:
                lines.append(f"| {row['family']} | {row['model']} | {row['n']} | "
                             f"{row['forward_backward_median_s'] * 1e3:.1f} | {row['optimizer_median_s'] * 1e3:.1f} |")
        lines += ["", "Speed ratios (a / b = time of b over time of a):", "",
                  "| ratio | " + " | ".join(f"n={n}" for n in lengths) + " |", "|---|" + "---|" * len(lengths)]
        for family, a, b in ratios(args):
            cells = []
            for n in lengths:
                ta = next((r["median_s"] for r in speed if (r["family"], r["model"], r["n"]) == (family, a, n)), None)
                tb = next((r["median_s"] for r in speed if (r["family"], r["model"], r["n"]) == (family, b, n)), None)
                cells.append("—" if ta is None or tb is None else f"{tb / ta:.2f}x")
            if any(c != "—" for c in cells):
                lines.append(f"| {family} {a} / {b} | " + " | ".join(cells) + " |")
    if peaks:
        mem_lengths = sorted({r["n"] for r in peaks})
        lines += ["", f"Peak memory of one training step, MB over the process's resident set after building model, "
                  f"optimizer and batch ({peaks[0].get('method', '')}; fresh process each):", "",
                  "| family | model | " + " | ".join(f"n={n}" for n in mem_lengths) + " |",
                  "|---|---|" + "---|" * len(mem_lengths)]
        for family, name in counts:
            cells = []
            for n in mem_lengths:
                row = next((r for r in peaks if (r["family"], r["model"], r["n"]) == (family, name, n)), None)
                cells.append("—" if row is None else ("failed" if "failed" in row else f"{row['step_peak_mb']:.0f}"))
            lines.append(f"| {family} | {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


REFERENCE = {"causal": "llama", "masked": "bert", "classify": "bert"}


def plot(args, speed, peaks, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [(f, "speed") for f in args.families if any(r["family"] == f for r in speed)]
    panels += [(f, "memory") for f in args.families if any(r["family"] == f and "failed" not in r for r in peaks)]
    if not panels:
        return
    fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 4), squeeze=False)
    for ax, (family, what) in zip(axes[0], panels):
        rows = [r for r in (speed if what == "speed" else peaks) if r["family"] == family and "failed" not in r]
        # Speed as a ratio to the family's attention baseline, measured within the same interleaved rounds (the
        # absolute rate follows the load of a shared machine from one length to the next; the ratio does not).
        reference = "gpt2" if args.suite == "small_gpt" else REFERENCE[family]
        base = {r["n"]: r["median_s"] for r in rows if r["model"] == reference} if what == "speed" else {}
        relative = bool(base)  # without the baseline in the run: absolute tokens/s
        for name in dict.fromkeys(r["model"] for r in rows):
            mine = sorted((r for r in rows if r["model"] == name and (not relative or r["n"] in base)),
                          key=lambda r: r["n"])
            values = [(base[r["n"]] / r["median_s"] if relative else r["tokens_per_s"]) if what == "speed"
                      else r["step_peak_mb"] for r in mine]
            ax.plot([r["n"] for r in mine], values, marker="o", label=name)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("sequence length n")
        speed_label = f"training speed / {reference}'s" if relative else "training tokens / s"
        ax.set_ylabel(speed_label if what == "speed" else "peak MB of one step")
        ax.set_title(f"{family}: {'speed' if what == 'speed' else 'peak memory'}")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
    fig.suptitle(f"Training step (fwd + bwd + AdamW), one thread, {args.tokens} tokens per step")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    torch.set_num_threads(1)
    if args.memory_worker:
        memory_worker(args)
        return
    if args.profile:
        profile(args)
        return
    if args.replot:
        folder = Path(args.replot)
        saved = json.loads((folder / "results.json").read_text())
        args.tokens = saved["tokens"]
        args.families = list(dict.fromkeys(r["family"] for r in saved["throughput"] + saved["memory"]))
        plot(args, saved["throughput"], saved["memory"], folder / "training.png")
        return
    if args.count_ops:
        rows = count_ops(args)
        args.output_dir.mkdir(parents=True, exist_ok=True)
        command = shlex.join(["python", "run_scripts/bench_training.py", *argv])
        text = (f"aten events torch.profiler records in one training step (suite {args.suite}, one thread); "
                "forward + backward counts every aten event, nested ones too.\n\n" + ops_table(rows))
        print(text)
        (args.output_dir / "ops.md").write_text(text + f"\nReproduce: `{command}`\n")
        (args.output_dir / "ops.json").write_text(json.dumps(dict(command=command, torch=torch.__version__,
                                                                  rows=rows), indent=1))
        return
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
    speed = throughput(args) if args.lengths else []
    peaks = memory(args, argv) if args.memory_lengths else []
    args.output_dir.mkdir(parents=True, exist_ok=True)
    text = render(args, counts, speed, peaks)
    print(text)
    command = shlex.join(["python", "run_scripts/bench_training.py", *argv])
    (args.output_dir / "table.md").write_text(text + f"\nReproduce: `{command}`\n")
    (args.output_dir / "results.json").write_text(json.dumps(dict(
        command=command, suite=args.suite, preset=args.preset,
        hidden_size=args.hidden_size, tokens=args.tokens,
        rounds=args.rounds, torch=torch.__version__, threads=1,
        parameters={f"{f}/{m}": c[0] for (f, m), c in counts.items()}, throughput=speed, memory=peaks), indent=1))
    plot(args, speed, peaks, args.output_dir / "training.png")


if __name__ == "__main__":
    main()
