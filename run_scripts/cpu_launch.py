"""Make ``accelerate launch --cpu --num_processes N script.py`` start N processes.

accelerate (1.15 and earlier) starts a single process for ``launch --cpu --num_processes N`` unless an MPI hostfile is
configured (huggingface/accelerate#2741): N is silently dropped, and the only trace left in the environment is the
``MASTER_PORT`` it sets for N > 1. The training scripts call :func:`relaunch_dropped_cpu_processes` first thing; it
reads N back from the launcher's command line (or accelerate's config file) and starts the N processes with
``torch.distributed.run``, which Accelerate then runs as DDP over gloo. This module imports nothing heavy, so the
check costs nothing when it does not apply.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
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
    """If ``accelerate launch --cpu`` dropped ``--num_processes``, run this script in that many processes with
    ``torch.distributed.run`` and exit with their status; otherwise return at once."""
    count = dropped_process_count()
    if count is None:
        return
    env = dict(os.environ, **{_GUARD: "1"})
    env.setdefault("OMP_NUM_THREADS", "1")
    command = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={count}", "--nnodes=1",
               f"--master_addr={env.get('MASTER_ADDR', '127.0.0.1')}", f"--master_port={env['MASTER_PORT']}",
               sys.argv[0], *sys.argv[1:]]
    print(f"accelerate launch --cpu started one process: starting {count} with torch.distributed.run (DDP, gloo).",
          file=sys.stderr)
    raise SystemExit(subprocess.call(command, env=env))
