"""A/B of two commits: the same benchmark, run against the model code of each, rounds interleaved between them.

Each commit is checked out into a temporary git worktree. One worker process per commit runs with
``PYTHONPATH=<that worktree>:<a copy of this benchmarks package and of common>``, so both sides run this tree's
benchmark code against their own model code (the benchmark code takes only the public model API, present in both).
Each worker builds its workloads and warms them up once; then the controller asks the two for one round at a time,
alternating which goes first, so that the load of a shared machine hits both alike (the idle worker waits on its
input). The result: each variant's median on either side, the ratio of medians B / A and the quartiles of the
per-round paired ratios, in one folder (results.json, table.md, ab.png) written by the harness.

    python run_scripts/bench_compare.py --base 797cb14 --head HEAD --benchmarks small_gpt_step,decode_256
    python run_scripts/bench_compare.py --list
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from .harness import (
    CLOCK,
    DECODE_TOKENS,
    Timing,
    Workload,
    command_line,
    consecutive,
    label_of,
    pyplot,
    run_round,
    save_figure,
    set_threads,
    source_state,
    write_report,
    workload,
)

SCRIPT = "run_scripts/bench_compare.py"
# The workers' copy of the recipes' groups the benchmark code runs on: benchmarks, and common (the timing loop),
# under this package name on their path.
WORKER_PACKAGE = "tnn_recipes"
WORKER_GROUPS = ("benchmarks", "common")


@dataclass(frozen=True)
class AbBenchmark:
    """A named benchmark the A/B runs: what it measures, how to build its workloads, and its default rounds."""

    description: str
    build: Callable[[], dict[str, Workload]]
    rounds: int


def training_steps(argv: list[str], n: int) -> Callable[[], dict[str, Workload]]:
    """The training step of each model of ``training``'s command line ``argv`` at length ``n``."""
    def build() -> dict[str, Workload]:
        from .training import parse_args, step_workloads

        args = parse_args([*argv, "--lengths", str(n), "--memory_lengths", ""])
        return {label_of(key): work for key, work in step_workloads(args, n).items()}
    return build


def decode_steps(context: int, batches: tuple[int, ...] = (1, 8)) -> Callable[[], dict[str, Workload]]:
    """One decode step of TNN dense and FD (default cache) at ``context`` for each batch, as the decoding
    benchmark times it (after an untimed step of the same decoder), at its default model sizes."""
    def build() -> dict[str, Workload]:
        from .generation import decoder, parse_args, tnn

        args = parse_args([])
        torch.manual_seed(0)
        models = {"tnn dense": tnn(args, "dense"), "tnn fd": tnn(args, "fd")}
        work = {}
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for batch in batches:
                for name, model in models.items():
                    step, _ = decoder(name, model, batch, context, args.vocab_size)
                    step = torch.no_grad()(step)  # a timed call: DECODE_TOKENS steps, the folds among them
                    work[f"{name} batch {batch} context {context}"] = workload(consecutive(step, DECODE_TOKENS),
                                                                               before=step)
        return work
    return build


def ladder_decode(rung: str, context: int) -> Callable[[], dict[str, Workload]]:
    """The scale ladder's ``rung`` TNN decode step at batch 1 after ``context`` tokens (initial weights, the plan
    fitted by the prefill), timed as bench_decode_floor times it: ``DECODE_TOKENS`` steps a call."""
    def build() -> dict[str, Workload]:
        from .generation import decoder
        from .scale_ladder import RUNGS, build_pair

        tnn, _ = build_pair(RUNGS[rung], 0)
        with torch.no_grad():
            step, _ = decoder("tnn dense", tnn, 1, context, tnn.config.vocab_size)
        step = torch.no_grad()(step)
        return {f"tnn {rung} batch 1 context {context}": workload(consecutive(step, DECODE_TOKENS), before=step)}
    return build


def prefills(rung: str, length: int, chunks: int) -> Callable[[], dict[str, Workload]]:
    """The forward that returns the decoding state over ``length`` tokens on the scale ladder's ``rung`` (initial
    weights, the plan fitted first), and the same tokens in ``chunks`` chunks each continuing the cache, as
    bench_prefill times them."""
    def build() -> dict[str, Workload]:
        from .prefill import ALL_RUNGS, FIT_TOKENS, build_pair, chunked_prefill, prefill

        tnn, _ = build_pair(ALL_RUNGS[rung], 0)
        ids = torch.randint(1, tnn.config.vocab_size, (1, length), generator=torch.Generator().manual_seed(0))
        with torch.no_grad():
            tnn(input_ids=torch.ones(1, FIT_TOKENS, dtype=torch.long), use_cache=True)  # the plan, fitted once
        logits = {}
        pieces = [torch.no_grad()(piece) for piece in chunked_prefill(tnn, ids, chunks, logits, "chunked")]
        return {f"tnn {rung} prefill {length}": workload(torch.no_grad()(prefill(tnn, ids, True, logits, "one"))),
                f"tnn {rung} {length} in {chunks} chunks": workload(*pieces)}
    return build


AB_BENCHMARKS = {
    "small_gpt_step": AbBenchmark("small-GPT training step (n=64, batch 12), TNN dense and FD",
                                  training_steps(["--suite", "small_gpt", "--models", "tnn-dense,tnn-fd"], 64), 15),
    "causal_step_128": AbBenchmark("width-256 causal LM training step at n=128 (4,096 tokens), TNN dense and FD",
                                   training_steps(["--families", "causal", "--models", "tnn-dense,tnn-fd",
                                                   "--tokens", "4096"], 128), 5),
    "causal_step_2048": AbBenchmark("width-256 causal LM training step at n=2048 (4,096 tokens), TNN dense and FD",
                                    training_steps(["--families", "causal", "--models", "tnn-dense,tnn-fd",
                                                    "--tokens", "4096"], 2048), 5),
    "decode_256": AbBenchmark("decode step after 256 tokens, batch 1 and 8, TNN dense and FD", decode_steps(256), 30),
    "decode_2048": AbBenchmark("decode step after 2,048 tokens, batch 1 and 8, TNN dense and FD", decode_steps(2048),
                               30),
    "decode_48m_2048": AbBenchmark("48.7M decode step after 2,048 tokens, batch 1", ladder_decode("48.7M", 2048), 30),
    "prefill_2048": AbBenchmark("48.7M prefill returning the state at 2,048 tokens, and in 4 chunks of 512",
                                prefills("48.7M", 2048, 4), 10),
    "lra_step_4096": AbBenchmark("LRA-size classification training step at n=4096 (batch 2), TNN dense, FD, SKI",
                                 training_steps(["--suite", "lra", "--models", "tnn-dense,tnn-fd,tnn-ski"], 4096), 5),
}


# -- worker: one commit's side ---------------------------------------------------------------------------------------


def serve(name: str) -> None:
    """Build ``name``'s workloads, warm them up, report ready (with the source commit), then run one round per
    ``round`` line on stdin and answer its seconds per variant as one JSON line; stop at ``quit`` or end of input.
    Whatever the model code prints goes to stderr, so stdout carries only the answers."""
    answers = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    set_threads(1)
    workloads = AB_BENCHMARKS[name].build()
    run_round(workloads)  # warm-up
    answers.write(json.dumps(dict(ready=list(workloads), source=source_state())) + "\n")
    for line in sys.stdin:
        if line.strip() != "round":
            break
        answers.write(json.dumps({key: sum(times) for key, times in run_round(workloads).items()}) + "\n")


# -- controller ------------------------------------------------------------------------------------------------------


class Worker:
    """One commit's worker process for one benchmark."""

    def __init__(self, tree: Path, library: Path, name: str):
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tree), str(library)]))
        module = f"{WORKER_PACKAGE}.benchmarks.compare"
        self.process = subprocess.Popen([sys.executable, "-m", module, "--worker", name],
                                        cwd=tree, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)

    def read(self) -> dict:
        line = self.process.stdout.readline()
        if not line:
            self.process.wait()
            raise RuntimeError(f"the benchmark worker stopped (status {self.process.returncode}); its stderr is above")
        return json.loads(line)

    def round(self) -> dict[str, float]:
        self.process.stdin.write("round\n")
        self.process.stdin.flush()
        return self.read()

    def close(self) -> None:
        if self.process.poll() is None:
            try:
                self.process.stdin.write("quit\n")
                self.process.stdin.close()
            except (BrokenPipeError, OSError):
                pass
            try:
                self.process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.process.kill()


def checkout(repo: Path, rev: str, folder: Path) -> Path:
    """``rev`` of ``repo`` as a detached git worktree in ``folder``."""
    subprocess.run(["git", "-C", str(repo), "worktree", "add", "--detach", "--quiet", str(folder), rev], check=True)
    return folder


def remove_worktree(repo: Path, folder: Path) -> None:
    subprocess.run(["git", "-C", str(repo), "worktree", "remove", "--force", str(folder)], capture_output=True)


def resolve(repo: Path, rev: str) -> str:
    """The full commit ``rev`` names in ``repo``; a ValueError naming the revision when there is none."""
    done = subprocess.run(["git", "-C", str(repo), "rev-parse", "--verify", f"{rev}^{{commit}}"], capture_output=True,
                          text=True)
    if done.returncode:
        raise ValueError(f"--base / --head {rev!r}: not a commit of {repo}.")
    return done.stdout.strip()


def compare(name: str, trees: tuple[Path, Path], library: Path, rounds: int) -> dict:
    """Run benchmark ``name`` on both trees, ``rounds`` interleaved rounds (the first side alternating). Returns the
    sides' sources and, per variant, both sides' timings and the ratios."""
    workers = [Worker(tree, library, name) for tree in trees]  # they build and warm up side by side
    try:
        ready = [worker.read() for worker in workers]
        timings = [{variant: Timing() for variant in side["ready"]} for side in ready]
        for index in range(rounds):
            order = (0, 1) if index % 2 == 0 else (1, 0)
            for side in order:
                for variant, seconds in workers[side].round().items():
                    timings[side][variant].samples.append(seconds)
            print(f"{name}: round {index + 1}/{rounds}", flush=True)
    finally:
        for worker in workers:
            worker.close()
    variants = {}
    for variant, a in timings[0].items():
        b = timings[1][variant]
        paired = [y / x for x, y in zip(a.samples, b.samples)]
        q = statistics.quantiles(paired, n=4, method="inclusive") if len(paired) > 1 else [paired[0]] * 3
        variants[variant] = dict(a=a.summary(), b=b.summary(), ratio=b.median / a.median, paired_ratio_q1=q[0],
                                 paired_ratio_median=statistics.median(paired), paired_ratio_q3=q[2])
    return dict(benchmark=name, description=AB_BENCHMARKS[name].description, rounds=rounds,
                sources=[side["source"] for side in ready], variants=variants)


def render(runs: list[dict], base: str, head: str) -> str:
    lines = [f"A = {base[:12]}, B = {head[:12]}. Medians of interleaved rounds (spread: interquartile range over "
             "median); ratio B / A of the medians (below 1: B faster) and the quartiles of the per-round paired "
             "ratios.", "", "| benchmark | variant | A ms | A spread | B ms | B spread | B / A | paired B / A (q1–q3) |",
             "|---|---|---|---|---|---|---|---|"]
    for run in runs:
        for variant, row in run["variants"].items():
            lines.append(f"| {run['benchmark']} | {variant} | {row['a']['median_s'] * 1e3:.2f} | "
                         f"{row['a']['spread']:.1%} | {row['b']['median_s'] * 1e3:.2f} | {row['b']['spread']:.1%} | "
                         f"{row['ratio']:.3f} | {row['paired_ratio_q1']:.3f}–{row['paired_ratio_q3']:.3f} |")
    return "\n".join(lines)


def plot(runs: list[dict], path: Path) -> None:
    plt = pyplot()

    rows = [(f"{run['benchmark']}: {variant}", row) for run in runs for variant, row in run["variants"].items()]
    fig, ax = plt.subplots(figsize=(7, 0.35 * len(rows) + 1.5))
    for y, (_, row) in enumerate(rows):
        # The paired quartiles as their own bar: on a noisy run the ratio of medians can fall outside them.
        ax.hlines(y, row["paired_ratio_q1"], row["paired_ratio_q3"], color="tab:blue")
        ax.plot(row["ratio"], y, "o", color="tab:blue")
    ax.axvline(1.0, color="grey", linestyle=":")
    ax.axvspan(0.95, 1.05, color="grey", alpha=0.15)
    ax.set_yticks(range(len(rows)), [label for label, _ in rows], fontsize=8)
    ax.set_xlabel("time B / time A (bars: quartiles of the paired per-round ratios)")
    save_figure(fig, path)


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base", default="HEAD~1", help="commit A")
    parser.add_argument("--head", default="HEAD", help="commit B")
    parser.add_argument("--benchmarks", default=",".join(AB_BENCHMARKS),
                        help=f"comma list from {', '.join(AB_BENCHMARKS)}")
    parser.add_argument("--rounds", type=int, default=None, help="rounds per benchmark (default: each one's own)")
    parser.add_argument("--repo", default=".", help="the git checkout the commits are taken from")
    parser.add_argument("--output_dir", default="results/ab")
    parser.add_argument("--list", action="store_true", help="list the benchmarks and stop")
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.benchmarks = args.benchmarks.split(",")
    unknown = [b for b in args.benchmarks if b not in AB_BENCHMARKS]
    if unknown:
        raise ValueError(f"--benchmarks {unknown}: allowed values are {list(AB_BENCHMARKS)}")
    if args.rounds is not None and args.rounds < 1:
        raise ValueError(f"--rounds must be at least 1, got {args.rounds}.")
    return args


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse_args(argv)
    if args.worker:
        serve(args.worker)
        return
    if args.list:
        for name, bench in AB_BENCHMARKS.items():
            print(f"{name}: {bench.description} ({bench.rounds} rounds)")
        return
    started = CLOCK()
    repo = Path(args.repo).resolve()
    base, head = resolve(repo, args.base), resolve(repo, args.head)
    runs = []
    with tempfile.TemporaryDirectory(prefix="bench_compare_") as tmp:
        library = Path(tmp) / "library"
        for group in WORKER_GROUPS:
            shutil.copytree(Path(__file__).resolve().parents[1] / group, library / WORKER_PACKAGE / group,
                            ignore=shutil.ignore_patterns("__pycache__"))
        (library / WORKER_PACKAGE / "__init__.py").write_text("")
        trees = (Path(tmp) / "a", Path(tmp) / "b")
        try:
            checkout(repo, base, trees[0])
            checkout(repo, head, trees[1])
            for name in args.benchmarks:
                runs.append(compare(name, trees, library, args.rounds or AB_BENCHMARKS[name].rounds))
        finally:
            for tree in trees:
                remove_worktree(repo, tree)
    table = render(runs, base, head)
    print(table)
    settings = dict(base=base, head=head, benchmarks=args.benchmarks, rounds=args.rounds, repo=args.repo)
    write_report(args.output_dir, "A/B of two commits", command_line(SCRIPT, argv), settings,
                 dict(base=base, head=head, runs=runs), table, figure="ab.png", plot=lambda path: plot(runs, path),
                 started=started)


if __name__ == "__main__":
    main()
