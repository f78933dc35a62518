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
  optimizer's step separately, per model and length, on this CPU's path and as an accelerator would launch them
  (``policies.accelerator_like_policy``; on an accelerator each event is a kernel launch or more).
* ``--compile``: each model also as ``torch.compile(model)`` (inductor), timed in the same interleaved rounds.

Suites: ``lm`` (the default: causal and masked LM models built from ``--preset`` at ``--hidden_size``), ``lra``
(sequence classification at the ``lra_listops`` preset's sizes: bidirectional TNN against BERT for sequence
classification with a position table of max(2048, n) rows) and ``small_gpt`` (a well-known small-GPT recipe's
character model: width 128, 4 layers, block 64, batch 12, a 65-symbol vocabulary, AdamW betas (0.9, 0.99) with
weight decay 0.1 on 2-D weights, for every model; TNN with ``glu_expand_ratio=1, rpe_dim=32, rpe_layers=3``
against transformers' GPT-2 (sdpa) and a minimal GPT as such recipes write it (``reference_models.MinimalGpt``),
both at the recipe's own size: 4 heads, a 4x MLP).

Timing, the machine record and the output folder (``results.json``, ``table.md``, ``training.png``) are the
harness's (:mod:`.harness`); the baselines and parameter matching are :mod:`.reference_models`'.

    python run_scripts/bench_training.py --families causal --output_dir results/bench_training/causal
    python run_scripts/bench_training.py --suite lra --output_dir results/bench_lra_speed
    python run_scripts/bench_training.py --suite small_gpt --output_dir results/bench_training/small_gpt
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import resource
import subprocess
import sys
from pathlib import Path

import torch

from modeling_tnn import TnnForCausalLM, TnnForMaskedLM, TnnForSequenceClassification, load_preset

from .harness import (
    CLOCK,
    Timing,
    Workload,
    command_line,
    interleaved,
    pyplot,
    save_figure,
    set_threads,
    time_once,
    workload,
    write_report,
)
from .op_count import aten_events
from .policies import accelerator_like_policy
from .reference_models import (
    POSITION_TABLES,
    MinimalGpt,
    baseline_model,
    count_parameters,
    matched_mlp_width,
)

SCRIPT = "run_scripts/bench_training.py"
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
    default_dir = {"lm": "bench_training/lm", "lra": "bench_lra_speed", "small_gpt": "bench_training/small_gpt"}
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


def step_workload(args: argparse.Namespace, model: torch.nn.Module, family: str, n: int) -> Workload:
    """One training step of ``model`` at length ``n`` as a harness workload of two phases: forward with the loss +
    backward, and the optimizer's step + zero_grad (timed apart, to say which of the two a gap is in)."""
    forward_backward, update = make_step(args, model, family, n, batch_for(args, n), vocab_of(model), args.seed,
                                         split=True)
    return workload(forward_backward, update, names=("forward_backward", "optimizer"))


def step_workloads(args: argparse.Namespace, n: int, models: dict | None = None) -> dict[tuple[str, str], Workload]:
    """Every job's training step at length ``n`` (``models``: already built ones, by job)."""
    max_n = max(args.lengths + args.memory_lengths)
    models = models or {job: build_job(args, *job, max_n) for job in jobs_of(args)}
    return {(family, name): step_workload(args, model, family, n) for (family, name), model in models.items()}


def throughput(args: argparse.Namespace) -> tuple[list[dict], dict]:
    """Rows of (family, model, n): the harness's summary of the step times, tokens/s; and the timings by row."""
    max_n = max(args.lengths + args.memory_lengths)
    models = {job: build_job(args, *job, max_n) for job in jobs_of(args)}
    rows, timings = [], {}
    for n in args.lengths:
        batch = batch_for(args, n)
        measured = interleaved(step_workloads(args, n, models), rounds=args.rounds, warmup=1, progress=f"n={n}")
        for (family, name), timing in measured.items():
            rows.append(dict(family=family, model=name, n=n, batch=batch, tokens_per_s=batch * n / timing.median,
                             **timing.summary()))
            timings[family, name, n] = timing
        gc.collect()
    return rows, timings


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
    _, seconds = time_once(step)
    peak = _status_kb("VmHWM") if method.startswith("VmHWM") else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(json.dumps(dict(family=family, model=name, n=n, batch=batch, baseline_mb=baseline / 1024,
                          peak_mb=peak / 1024, step_peak_mb=(peak - baseline) / 1024, step_s=seconds,
                          method=method)))


def _env_with_package() -> dict[str, str]:
    """This process's environment with the folder holding this package first on PYTHONPATH (and the model code's
    tree after it), so that ``python -m`` of this module finds the same code in a subprocess."""
    top = sys.modules[__spec__.name.split(".")[0]]
    from .harness import source_tree

    paths = [str(Path(top.__file__).resolve().parents[1]), str(source_tree()), os.environ.get("PYTHONPATH", "")]
    return dict(os.environ, PYTHONPATH=os.pathsep.join(dict.fromkeys(p for p in paths if p)))


def memory(args: argparse.Namespace, argv: list[str]) -> list[dict]:
    rows = []
    for n in args.memory_lengths:
        for family, name in jobs_of(args):
            spec = f"{family}:{name}:{n}:{batch_for(args, n)}"
            command = [sys.executable, "-m", __spec__.name, *argv, "--memory_worker", spec]
            result = subprocess.run(command, capture_output=True, text=True, env=_env_with_package())
            if result.returncode != 0:
                print(f"memory {spec} failed (rc {result.returncode}): {result.stderr[-400:]}", flush=True)
                rows.append(dict(family=family, model=name, n=n, batch=batch_for(args, n), failed=result.returncode))
                continue
            row = json.loads(result.stdout.strip().splitlines()[-1])
            print(f"memory {spec}: {row['step_peak_mb']:.0f} MB over the baseline ({row['step_s']:.1f} s)", flush=True)
            rows.append(row)
    return rows


# -- profile -------------------------------------------------------------------------------------------------------


def profile(args: argparse.Namespace) -> tuple[list[dict], str, dict]:
    """torch.profiler's top operators of one training step per model and length (after one unprofiled step): rows
    with the profiled step's seconds, the tables as text, and the step times for the figure."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    rows, texts, timings = [], [], {}
    max_n = max(args.lengths)
    for family, name in jobs_of(args):
        model = build_job(args, family, name, max_n)
        for n in args.lengths:
            step = make_step(args, model, family, n, batch_for(args, n), vocab_of(model), args.seed)
            step()
            with torch_profile(activities=[ProfilerActivity.CPU]) as prof:
                _, seconds = time_once(step)
            averages = prof.key_averages()
            table = averages.table(sort_by="self_cpu_time_total", row_limit=args.profile_rows,
                                   max_name_column_width=60)
            top = sorted(averages, key=lambda e: -e.self_cpu_time_total)[:args.profile_rows]
            rows.append(dict(family=family, model=name, n=n, batch=batch_for(args, n), profiled_step_s=seconds,
                             top_self_cpu_ms={e.key: e.self_cpu_time_total / 1e3 for e in top}))
            texts.append(f"## {family} {name} n={n} batch={batch_for(args, n)}: step {seconds:.3f} s (profiled)\n\n"
                         f"```\n{table}\n```")
            timings[family, name, n] = Timing([seconds])
            print(texts[-1], flush=True)
    return rows, "\n\n".join(texts), timings


# -- op counts ------------------------------------------------------------------------------------------------------


def count_ops(args: argparse.Namespace) -> list[dict]:
    """Per model and length: aten events of forward + backward (on this machine's path, and as an accelerator
    would launch them) and of the optimizer step, parameter tensors."""
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
            total, names = aten_events(forward_backward)
            optimizer_total, _ = aten_events(update)
            with accelerator_like_policy():
                forward_backward()
                update()
                one_chunk, _ = aten_events(forward_backward)
            top = dict(sorted(names.items(), key=lambda item: -item[1])[:12])
            tensors = len({id(p) for p in model.parameters()})
            rows.append(dict(family=family, model=name, n=n, batch=batch_for(args, n), forward_backward=total,
                             forward_backward_one_chunk=one_chunk, optimizer=optimizer_total,
                             parameter_tensors=tensors, top=top))
            print(f"{family} {name} n={n}: {total} aten ops forward + backward ({one_chunk} in one channel chunk), "
                  f"{optimizer_total} in the optimizer step, {tensors} parameter tensors", flush=True)
    return rows


def plot_ops(rows: list[dict], path: Path) -> None:
    """Bars of the forward + backward operator counts (this machine's path and the accelerator's) per job."""
    plt = pyplot()

    labels = [f"{r['family']} {r['model']} n={r['n']}" for r in rows]
    fig, ax = plt.subplots(figsize=(max(5.0, 0.8 * len(rows) + 2), 4))
    positions = range(len(rows))
    ax.bar([i - 0.2 for i in positions], [r["forward_backward"] for r in rows], width=0.4, label="this CPU's path")
    ax.bar([i + 0.2 for i in positions], [r["forward_backward_one_chunk"] for r in rows], width=0.4,
           label="one channel chunk (as an accelerator)")
    ax.set_xticks(list(positions), labels, rotation=45, ha="right", fontsize=8)
    ax.set_ylabel("aten events, forward + backward")
    ax.legend(fontsize=8)
    ax.grid(True, axis="y", alpha=0.3)
    save_figure(fig, path)


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


def model_rows(counts, lengths: list[int], rows: list[dict], cell) -> list[str]:
    """Table rows ``| family | model | cell(n) ... |``: one per job, one cell per length (— where not measured)."""
    lines = []
    for family, name in counts:
        cells = []
        for n in lengths:
            row = next((r for r in rows if (r["family"], r["model"], r["n"]) == (family, name, n)), None)
            cells.append("—" if row is None else cell(row))
        lines.append(f"| {family} | {name} | " + " | ".join(cells) + " |")
    return lines


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
        lines += model_rows(counts, lengths, speed, lambda r: f"{1 / r['median_s']:.3f} ({r['tokens_per_s']:.0f})")
        lines += ["", "Where a step's time goes (median ms: forward with the loss + backward, and the optimizer's step "
                  "+ zero_grad, timed separately within each step; spread: the steps' interquartile range over "
                  "their median):", "",
                  "| family | model | n | step | forward + backward | optimizer | spread |", "|---|---|---|---|---|---|---|"]
        for row in speed:
            lines.append(f"| {row['family']} | {row['model']} | {row['n']} | {row['median_s'] * 1e3:.1f} | "
                         f"{row['forward_backward_median_s'] * 1e3:.1f} | {row['optimizer_median_s'] * 1e3:.1f} | "
                         f"{row['spread']:.1%} |")
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
        lines += model_rows(counts, mem_lengths, peaks,
                            lambda r: "failed" if "failed" in r else f"{r['step_peak_mb']:.0f}")
    return "\n".join(lines) + "\n"


REFERENCE = {"causal": "llama", "masked": "bert", "classify": "bert"}


def plot(args, speed, peaks, path: Path) -> None:
    plt = pyplot()

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
    save_figure(fig, path, dpi=120)


def settings_of(args: argparse.Namespace) -> dict:
    """The run's settings as results.json records them."""
    return {key: str(value) if isinstance(value, Path) else value for key, value in vars(args).items()
            if key not in ("memory_worker", "replot")}


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


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse_args(argv)
    started = CLOCK()
    set_threads(1)
    command = command_line(SCRIPT, argv)
    if args.memory_worker:
        memory_worker(args)
        return
    if args.replot:
        folder = Path(args.replot)
        saved = json.loads((folder / "results.json").read_text())
        args.tokens = saved["settings"]["tokens"]
        results = saved["results"]
        args.families = list(dict.fromkeys(r["family"] for r in results["throughput"] + results["memory"]))
        plot(args, results["throughput"], results["memory"], folder / "training.png")
        return
    if args.profile:
        rows, text, timings = profile(args)
        write_report(args.output_dir, f"training step profile ({args.suite})", command, settings_of(args),
                     dict(profiles=rows), "Top operators by self CPU time of one profiled training step (one "
                     "thread).\n\n" + text, figure="training.png", timings=timings, started=started)
        return
    if args.count_ops:
        rows = count_ops(args)
        text = (f"aten events torch.profiler records in one training step (suite {args.suite}, one thread); "
                "forward + backward counts every aten event, nested ones too.\n\n" + ops_table(rows))
        print(text)
        write_report(args.output_dir, f"training step operator counts ({args.suite})", command, settings_of(args),
                     dict(ops=rows), text, figure="ops.png", plot=lambda path: plot_ops(rows, path), started=started)
        return
    counts = parameter_counts(args)
    speed, _ = throughput(args) if args.lengths else ([], {})
    peaks = memory(args, argv) if args.memory_lengths else []
    text = render(args, counts, speed, peaks)
    print(text)
    results = dict(parameters={f"{f}/{m}": c[0] for (f, m), c in counts.items()}, throughput=speed, memory=peaks)
    write_report(args.output_dir, f"training step ({args.suite})", command, settings_of(args), results, text,
                 figure="training.png", plot=lambda path: plot(args, speed, peaks, path), started=started)


if __name__ == "__main__":
    main()
