"""The GLUE suite behind ``run_glue_suite.py`` (its docstring has the usage): every locally available task for
one or more checkpoints, each (model, task) a ``finetune_glue`` process, one results table with the majority-class
baseline beside it."""

from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from ..common.data_location import find_data_dir
from ..common.flag_checks import UsageError, check_local_source, exit_on_usage_error
from .metrics import majority_baseline
from .tasks import TASK_NAMES, available_splits, get_task, load_glue_local

SHORT_METRIC = {"accuracy": "acc", "f1": "F1", "matthews_correlation": "MCC", "pearson": "Pearson",
                "spearmanr": "Spearman"}
# Trainer's bookkeeping numbers, not scores: left out of the table but kept in the JSON.
NOT_SCORES = ("runtime", "per_second", "samples", "epoch", "loss", "preparation_time")


def default_glue_dir() -> str:
    """``glue/`` in the data folder (``$TNN_DATA_DIR``, else ``shared/data`` beside the project), relative to the
    working directory; ``glue`` when there is none (the suite then says that the folder is missing)."""
    found = find_data_dir()
    return os.path.relpath(found / "glue") if found else "glue"


def select_tasks(requested: str | None, glue_dir: str) -> tuple[list[str], dict[str, str]]:
    """The tasks to run (requested, or all) whose train and dev files exist, and a reason for each one left out."""
    names = [get_task(name).name for name in requested.split(",")] if requested else list(TASK_NAMES)
    tasks, skipped = [], {}
    for name in names:
        task = get_task(name)
        have = available_splits(task, glue_dir)
        missing = [split for split in task.split_files() if split not in have]
        if not missing:
            tasks.append(name)
        elif have:
            skipped[name] = f"only {', '.join(have)} available locally (no {', '.join(missing)})"
        else:
            skipped[name] = f"no files under {Path(glue_dir) / task.folder}"
    return tasks, skipped


def parse_pairs(values: list[str], what: str) -> dict[str, str]:
    """``["a=x", "b=y"]`` -> ``{"a": "x", "b": "y"}``; raises :class:`UsageError` (a ``ValueError``) on an item
    without ``=``."""
    pairs = {}
    for value in values:
        key, sep, rest = value.partition("=")
        if not sep or not key:
            raise UsageError(f"{what} must look like NAME=VALUE, got {value!r}.")
        pairs[key] = rest
    return pairs


def cell(task_name: str, metrics: dict[str, float] | None) -> str:
    """One table cell: the task's metrics x 100, ``a / b`` when there are several (MNLI: matched / mismatched)."""
    if metrics is None:
        return "–"
    task = get_task(task_name)
    keys = [f"eval_{m}" for m in task.metrics] + (["eval_accuracy_mm"] if task.name == "mnli" else [])
    values = [metrics.get(key, metrics.get(key.removeprefix("eval_"))) for key in keys]
    return " / ".join("–" if v is None or math.isnan(v) else f"{100 * v:.1f}" for v in values)


def main_score(task_name: str, metrics: dict[str, float] | None) -> float:
    """The single number averaged into the table's mean column (``combined_score`` for multi-metric tasks)."""
    if metrics is None:
        return float("nan")
    task = get_task(task_name)
    key = task.metrics[0] if len(task.metrics) == 1 else "combined_score"
    value = metrics.get(f"eval_{key}", metrics.get(key))
    return float("nan") if value is None else float(value)


def markdown_table(tasks: list[str], rows: dict[str, dict[str, dict | None]]) -> str:
    """Rows = models (and the baseline), columns = tasks, plus the mean of the per-task main scores."""
    header = ["model"] + [f"{get_task(t).folder} ({' / '.join(SHORT_METRIC[m] for m in get_task(t).metrics)})"
                          for t in tasks] + ["mean"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for name, per_task in rows.items():
        scores = [main_score(t, per_task.get(t)) for t in tasks]
        mean = "–" if any(math.isnan(s) for s in scores) else f"{100 * sum(scores) / len(scores):.1f}"
        lines.append("| " + " | ".join([name] + [cell(t, per_task.get(t)) for t in tasks] + [mean]) + " |")
    return "\n".join(lines)


def run_one(command: list[str], log_path: Path, env: dict[str, str] | None = None,
            cwd: Path | None = None) -> float:
    """Run one process (a finetuning run, or the comparison recipe's pretraining) with its output in ``log_path``;
    returns the wall time in seconds. A failure raises RuntimeError naming the program, with the log's tail."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    start = time.time()
    with log_path.open("w") as log:
        process = subprocess.run(command, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=cwd)
    if process.returncode != 0:
        program = command[2] if command[1] == "-m" else Path(command[1]).name
        tail = "".join(log_path.read_text().splitlines(keepends=True)[-15:])
        raise RuntimeError(f"{program} failed (exit {process.returncode}); log {log_path}:\n{tail}")
    return time.time() - start


def main(argv: list[str] | None = None) -> dict:
    """Run the suite; returns what it writes to ``glue_results.json``."""
    argv = sys.argv[1:] if argv is None else argv
    passthrough = argv[argv.index("--") + 1:] if "--" in argv else []
    argv = argv[: argv.index("--")] if "--" in argv else argv
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", action="append", required=True, metavar="NAME=CHECKPOINT",
                        help="a checkpoint folder (or Hub id) to finetune, with its name in the table; repeatable")
    parser.add_argument("--glue_dir", default=default_glue_dir(), help="official GLUE layout (default: %(default)s)")
    parser.add_argument("--tasks", default=None, help="comma-separated tasks (default: all available locally)")
    parser.add_argument("--task_args", action="append", default=[], metavar="TASK=ARGS",
                        help="extra finetune_glue.py arguments for one task, e.g. 'sst2=--max_train_samples 8000'")
    parser.add_argument("--max_eval_samples", type=int, default=None,
                        help="forwarded to every run and used for the majority baseline")
    parser.add_argument("--output_dir", default="outputs/glue_suite", help="checkpoints and logs, one folder a run")
    parser.add_argument("--results_dir", default=None, help="where the tables go (default: --output_dir)")
    parser.add_argument("--skip_existing", action="store_true",
                        help="reuse a run whose eval_results.json exists (resume an interrupted suite)")
    parser.add_argument("--jobs", type=int, default=1, help="finetuning runs at a time (default: %(default)s)")
    parser.add_argument("--threads", type=int, default=None,
                        help="OMP_NUM_THREADS of each run; 1 avoids threads fighting over shared cores")
    parser.add_argument("--dry_run", action="store_true", help="print the commands and stop")
    args = parser.parse_args(argv)

    if args.jobs < 1:
        raise UsageError(f"--jobs must be at least 1, got {args.jobs}.")
    models = parse_pairs(args.model, "--model")
    for model_name, checkpoint in models.items():  # a mistyped folder: one line now, not a Hub error per run
        check_local_source(checkpoint, f"--model {model_name}=")
    try:
        task_args = {get_task(k).name: v for k, v in parse_pairs(args.task_args, "--task_args").items()}
        requested = [get_task(name).name for name in args.tasks.split(",")] if args.tasks else None
    except ValueError as error:
        raise UsageError(str(error)) from None
    if not Path(args.glue_dir).is_dir():
        raise UsageError(f"--glue_dir {args.glue_dir!r}: no such folder.")
    tasks, skipped = select_tasks(",".join(requested) if requested else None, args.glue_dir)
    if not tasks:
        raise UsageError(f"No GLUE task with train and dev files under {args.glue_dir}: {skipped}")
    for name, reason in skipped.items():
        print(f"skipping {name}: {reason}")
    results_dir = Path(args.results_dir or args.output_dir)
    eval_limit = ["--max_eval_samples", str(args.max_eval_samples)] if args.max_eval_samples else []

    report: dict = {"glue_dir": args.glue_dir, "tasks": tasks, "skipped": skipped, "models": models,
                    "jobs": args.jobs, "threads": args.threads,
                    "common_args": passthrough, "task_args": task_args, "results": {}, "wall_seconds": {},
                    "commands": {}, "majority_baseline": {}}
    for task_name in tasks:
        try:  # a header without the task's columns, an empty file: one line naming the file
            data = load_glue_local(task_name, args.glue_dir)
        except (ValueError, FileNotFoundError) as error:
            raise UsageError(str(error)) from None
        baseline = {}
        for split in get_task(task_name).eval_splits:
            suffix = "_mm" if split == "validation_mismatched" else ""
            labels = list(data[split]["label"])[: args.max_eval_samples]
            metrics = majority_baseline(task_name, list(data["train"]["label"]), labels)
            baseline.update({f"eval_{k}{suffix}": v for k, v in metrics.items()})
        report["majority_baseline"][task_name] = baseline

    jobs = []  # task-major, so that with --jobs 2 the models' runs of a task go side by side
    for task_name in tasks:
        for model_name, checkpoint in models.items():
            out = Path(args.output_dir) / model_name / task_name
            command = [sys.executable, "-m", "modeling_tnn.recipes.glue.finetuning", "--model_name_or_path", checkpoint,
                       "--task_name", task_name, "--glue_dir", args.glue_dir, "--output_dir", str(out),
                       "--do_train", "--do_eval", *eval_limit, *passthrough,
                       *shlex.split(task_args.get(task_name, ""))]
            shown = shlex.join(["python", *command[1:]])
            report["commands"].setdefault(model_name, {})[task_name] = shown
            if args.dry_run:
                print(shown)
            else:
                jobs.append((model_name, task_name, command, shown, out))
    env = dict(os.environ, **({"OMP_NUM_THREADS": str(args.threads)} if args.threads else {}))

    def run_job(job: tuple) -> tuple[str, str, float]:
        model_name, task_name, command, shown, out = job
        if args.skip_existing and (out / "eval_results.json").is_file():
            return model_name, task_name, float("nan")
        print(f"[{time.strftime('%H:%M:%S')}] start {model_name} / {task_name}: {shown}", flush=True)
        return model_name, task_name, run_one(command, out / "log.txt", env)

    finished = {}
    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        for model_name, task_name, seconds in pool.map(run_job, jobs):
            out = Path(args.output_dir) / model_name / task_name
            metrics = json.loads((out / "eval_results.json").read_text())
            finished[model_name, task_name] = (metrics, seconds)
            scores = {k: round(v, 4) for k, v in metrics.items() if not any(s in k for s in NOT_SCORES)}
            print(f"[{time.strftime('%H:%M:%S')}] done {model_name} / {task_name}: {scores} ({seconds:.0f} s)",
                  flush=True)
    for model_name in models:
        for task_name in tasks:
            if (model_name, task_name) in finished:
                metrics, seconds = finished[model_name, task_name]
                report["results"].setdefault(model_name, {})[task_name] = metrics
                report["wall_seconds"].setdefault(model_name, {})[task_name] = round(seconds, 1)
    if args.dry_run:
        return report

    rows = {**report["results"], "majority class": report["majority_baseline"]}
    table = markdown_table(tasks, rows)
    notes = [f"- {name}: {reason}" for name, reason in skipped.items()]
    markdown = ("GLUE dev scores (x 100); `mean` averages the per-task main score (combined_score where a task has "
                "two metrics).\n\n" + table + "\n" + ("\nNot run:\n" + "\n".join(notes) + "\n" if notes else ""))
    results_dir.mkdir(parents=True, exist_ok=True)
    (results_dir / "glue_results.md").write_text(markdown)
    (results_dir / "glue_results.json").write_text(json.dumps(report, indent=2) + "\n")
    print(markdown)
    print(f"wrote {results_dir / 'glue_results.md'} and {results_dir / 'glue_results.json'}")
    return report


def cli(argv: list[str] | None = None) -> None:
    """Entry point: an input error prints one ``run_glue_suite.py: error: ...`` line and exits with status 2."""
    with exit_on_usage_error("run_glue_suite.py"):
        main(argv)
