"""Make ``accelerate launch --cpu --num_processes N script.py`` start N processes.

accelerate (1.15 and earlier) starts a single process for ``launch --cpu --num_processes N`` unless an MPI hostfile is
configured (huggingface/accelerate#2741): N is silently dropped, and the only trace left in the environment is the
``MASTER_PORT`` it sets for N > 1. The training scripts call :func:`relaunch_dropped_cpu_processes` first thing; it
reads N back from the launcher's command line (or accelerate's config file) and starts the N processes itself, with
the environment ``torch.distributed.run`` would give them; Accelerate then runs them as DDP over gloo. This module
imports nothing heavy, so the check costs nothing when it does not apply.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

_DISTRIBUTED_ENV = ("WORLD_SIZE", "RANK", "LOCAL_RANK", "PMI_SIZE", "OMPI_COMM_WORLD_SIZE")
_GUARD = "TNN_CPU_RELAUNCHED"


def dropped_process_count(env: dict[str, str] | None = None, parent_argv: list[str] | None = None) -> int | None:
    """The N of an ``accelerate launch --cpu --num_processes N`` that started only this process, else ``None``.

    ``parent_argv`` defaults to the parent process's command line (Linux ``/proc``)."""
    env = dict(os.environ) if env is None else env
    if (env.get("ACCELERATE_USE_CPU", "").lower() != "true" or "MASTER_PORT" not in env or env.get(_GUARD)
            or any(key in env for key in _DISTRIBUTED_ENV)):
        return None
    if parent_argv is None:
        try:
            parent_argv = Path(f"/proc/{os.getppid()}/cmdline").read_bytes().decode().split("\0")
        except OSError:
            print("warning: accelerate launch --cpu started a single process; use torchrun --nproc_per_node N for "
                  "several.", file=sys.stderr)
            return None
    marks = [i for i, arg in enumerate(parent_argv) if arg == "launch" or arg.endswith("accelerate.commands.launch")]
    if not marks:
        return None
    launcher_args = parent_argv[marks[0] + 1:]
    script = Path(sys.argv[0]).name
    # Only the launcher's own flags: stop at the training script.
    for i, arg in enumerate(launcher_args):
        if Path(arg).name == script:
            launcher_args = launcher_args[:i]
            break
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--num_processes", type=int)
    parser.add_argument("--num_machines", type=int, default=1)
    parser.add_argument("--config_file")
    known, _ = parser.parse_known_args(launcher_args)
    count = known.num_processes
    if count is None:
        from accelerate.commands.config.config_args import default_config_file, load_config_from_file

        config_file = known.config_file or default_config_file
        count = load_config_from_file(config_file).num_processes if Path(config_file).is_file() else None
    if known.num_machines > 1 or not count or count < 2:
        return None
    return count


def relaunch_dropped_cpu_processes() -> None:
    """If ``accelerate launch --cpu`` dropped ``--num_processes``, run this script in that many processes and exit
    with their status; otherwise return at once.

    The processes get the environment ``torch.distributed.run`` would give them (``RANK``, ``WORLD_SIZE``,
    ``LOCAL_RANK``, ...), without the cost of a launcher process that imports torch; if one fails the others are
    stopped."""
    count = dropped_process_count()
    if count is None:
        return
    print(f"accelerate launch --cpu started one process: starting {count} (DDP over gloo).", file=sys.stderr)
    base = dict(os.environ, **{_GUARD: "1"}, WORLD_SIZE=str(count), LOCAL_WORLD_SIZE=str(count), GROUP_RANK="0",
                MASTER_ADDR=os.environ.get("MASTER_ADDR", "127.0.0.1"))
    base.setdefault("OMP_NUM_THREADS", "1")
    workers = [subprocess.Popen([sys.executable, sys.argv[0], *sys.argv[1:]],
                                env=dict(base, RANK=str(rank), LOCAL_RANK=str(rank)))
               for rank in range(count)]
    status = 0
    try:
        while workers:
            for worker in list(workers):
                code = worker.poll()
                if code is None:
                    continue
                workers.remove(worker)
                if code != 0:
                    status = status or code
                    for other in workers:  # a failed rank would leave the others waiting in a collective
                        other.terminate()
            time.sleep(0.2)
    finally:
        for worker in workers:
            worker.kill()
    raise SystemExit(status)
