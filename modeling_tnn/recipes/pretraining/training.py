"""``train_clm.py`` and ``train_mlm.py`` from end to end: :func:`~.setup.setup` (the flags end there), then
:func:`~.loop.train_loop` and :func:`~.finish.finish_run`; :func:`cli_main` is the scripts' entry point.

Programmatic use (the quality benchmark does this)::

    args = parse_args("clm", ["--config_name", "tiny", "--max_train_steps", "10"])
    outcome = run(args, "clm", raw_datasets=my_dataset_dict)   # outcome.results is all_results.json
"""

from __future__ import annotations

import sys
from pathlib import Path

from datasets import DatasetDict

from ..common.flag_checks import UsageError
from .arguments import PretrainingArguments, parse_args
from .checkpoints import find_latest_checkpoint
from .finish import finish_run
from .loop import train_loop
from .session import RunOutcome, Session
from .setup import setup
from .stop_signals import EXIT_CODES, TrainingInterrupted


def train(session: Session) -> RunOutcome:
    """The loop of ``session.schedule``, then the finish of ``session.finish`` (the final save, all_results.json,
    the length evaluation, samples, the Hub)."""
    return finish_run(session, train_loop(session))


def run(args: PretrainingArguments, task: str, raw_datasets: DatasetDict | None = None) -> RunOutcome:
    """Set up and train (see :func:`setup` and :func:`train`). ``raw_datasets`` replaces the data flags with
    in-memory ``train``/``validation`` splits."""
    return train(setup(args, task, raw_datasets))


def cli_main(task: str, argv: list[str] | None = None) -> None:
    """Entry point of the scripts: an input error prints ``error: ...`` and exits with status 2 before training."""
    script = Path(sys.argv[0]).name
    try:
        session = setup(parse_args(task, argv), task)
    except (UsageError, FileNotFoundError) as error:
        print(f"{script}: error: {error}", file=sys.stderr)
        raise SystemExit(2) from None
    except KeyboardInterrupt:
        print(f"{script}: interrupted before training started; nothing to save.", file=sys.stderr)
        raise SystemExit(EXIT_CODES["SIGINT"]) from None
    try:
        train(session)
    except TrainingInterrupted as stop:
        if session.accelerator.is_main_process:  # every rank stops and exits; one line tells the user how to resume
            print(f"{script}: stopped by {stop.signal_name} at step {stop.step}; saved checkpoint {stop.checkpoint}; "
                  f"resume with --resume_from_checkpoint {stop.checkpoint}", file=sys.stderr)
        raise SystemExit(stop.exit_code) from None
    except KeyboardInterrupt:
        latest = find_latest_checkpoint(session.schedule.output_dir)
        where = (f"; the newest checkpoint is {latest}: resume with --resume_from_checkpoint {latest}" if latest
                 else "; no checkpoint was written")
        print(f"{script}: interrupted{where}", file=sys.stderr)
        raise SystemExit(EXIT_CODES["SIGINT"]) from None
