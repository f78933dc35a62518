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

This module measures; the jobs, models and steps are :mod:`.training_models`', the tables and figures
:mod:`.training_report`'s. Timing, the machine record and the output folder (``results.json``, ``table.md``,
``training.png``) are the harness's (:mod:`.harness`); the baselines and parameter matching are
:mod:`.reference_models`'.

    python run_scripts/bench_training.py --families causal --output_dir results/bench_training/causal
    python run_scripts/bench_training.py --suite lra --output_dir results/bench_lra_speed
    python run_scripts/bench_training.py --suite small_gpt --output_dir results/bench_training/small_gpt
"""

import argparse
import gc
import json
import resource
import subprocess
import sys
from pathlib import Path

import torch

from .harness import (
    CLOCK,
    Timing,
    Workload,
    command_line,
    env_with_package,
    interleaved,
    set_threads,
    status_kb,
    time_once,
    workload,
    write_report,
)
from .op_count import aten_events
from .policies import accelerator_like_policy
from .training_models import (
    SMALL_GPT,
    SUITES,
    batch_for,
    build_job,
    jobs_of,
    make_step,
    parameter_counts,
    vocab_of,
)
from .training_report import ops_table, plot, plot_ops, render

SCRIPT = "run_scripts/bench_training.py"


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



def memory_worker(args: argparse.Namespace) -> None:
    family, name, n, batch = args.memory_worker.split(":")
    n, batch = int(n), int(batch)
    model = build_job(args, family, name, max(n, max(args.memory_lengths + args.lengths)))
    step = make_step(args, model, family, n, batch, vocab_of(model), args.seed)
    gc.collect()
    baseline = status_kb("VmRSS")
    try:
        Path("/proc/self/clear_refs").write_text("5")  # reset VmHWM to the current RSS
        method = "VmHWM after clear_refs"
    except OSError:
        method = "ru_maxrss"
    _, seconds = time_once(step)
    peak = status_kb("VmHWM") if method.startswith("VmHWM") else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(json.dumps(dict(family=family, model=name, n=n, batch=batch, baseline_mb=baseline / 1024,
                          peak_mb=peak / 1024, step_peak_mb=(peak - baseline) / 1024, step_s=seconds,
                          method=method)))


def memory(args: argparse.Namespace, argv: list[str]) -> list[dict]:
    rows = []
    for n in args.memory_lengths:
        for family, name in jobs_of(args):
            spec = f"{family}:{name}:{n}:{batch_for(args, n)}"
            command = [sys.executable, "-m", __spec__.name, *argv, "--memory_worker", spec]
            result = subprocess.run(command, capture_output=True, text=True, env=env_with_package())
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


def settings_of(args: argparse.Namespace) -> dict:
    """The run's settings as results.json records them."""
    return {key: str(value) if isinstance(value, Path) else value for key, value in vars(args).items()
            if key not in ("memory_worker", "replot")}


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