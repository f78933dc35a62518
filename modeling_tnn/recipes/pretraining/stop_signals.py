"""Stopping a training run cleanly on SIGINT/SIGTERM: the loop finishes its step, writes a checkpoint and exits with
the shell's status for that signal."""

from __future__ import annotations

import signal
import sys
import threading
from pathlib import Path
from typing import Any

import torch
from accelerate import Accelerator

EXIT_CODES = {"SIGINT": 130, "SIGTERM": 143}  # 128 + the signal number, as shells report a signal death


class TrainingInterrupted(KeyboardInterrupt):
    """SIGINT or SIGTERM stopped training after a checkpoint of the current step was written (``checkpoint``); the
    CLI prints one line saying how to resume and exits with ``exit_code`` (130 for SIGINT, 143 for SIGTERM). A
    ``KeyboardInterrupt``, so that callers' ``except Exception`` blocks do not swallow the user's stop."""

    def __init__(self, signal_name: str, step: int, checkpoint: Path):
        self.signal_name, self.step, self.checkpoint = signal_name, step, checkpoint
        self.exit_code = EXIT_CODES.get(signal_name, 1)
        super().__init__(f"{signal_name} at step {step}: saved checkpoint {checkpoint}; resume with "
                         f"--resume_from_checkpoint {checkpoint}")


class StopOnSignal:
    """While active, SIGINT and SIGTERM only set :attr:`signal_name`; the training loop checks it after each
    optimizer step, writes a checkpoint and stops. A second SIGINT raises ``KeyboardInterrupt`` at once (no
    checkpoint). Handlers are installed only in the main thread, and the previous ones come back on exit."""

    SIGNALS = ("SIGINT", "SIGTERM")

    def __init__(self, say: Any = None) -> None:
        self.signal_name: str | None = None
        self._previous: dict[int, Any] = {}
        self._say = say or (lambda line: print(line, file=sys.stderr, flush=True))

    def __enter__(self) -> StopOnSignal:
        if threading.current_thread() is threading.main_thread():
            for name in self.SIGNALS:
                number = getattr(signal, name, None)
                if number is not None:
                    self._previous[number] = signal.signal(number, self._handle)
        return self

    def __exit__(self, *exc_info: Any) -> None:
        for number, handler in self._previous.items():
            signal.signal(number, handler)
        self._previous.clear()

    def _handle(self, number: int, frame: Any) -> None:
        name = signal.Signals(number).name
        if self.signal_name is not None:
            if name == "SIGINT":
                raise KeyboardInterrupt
            return
        self.signal_name = name
        self._say(f"{name} received: finishing this step, then writing a checkpoint"
                  + (" (Ctrl-C again stops at once, without one)" if name == "SIGINT" else ""))

    def requested(self, accelerator: Accelerator) -> str | None:
        """The signal that asked to stop, agreed by every process (any process's signal stops them all)."""
        if accelerator.num_processes == 1:
            return self.signal_name
        code = torch.tensor([self.SIGNALS.index(self.signal_name) + 1 if self.signal_name else 0],
                            device=accelerator.device)
        code = _all_max(code)
        return self.SIGNALS[int(code.item()) - 1] if int(code.item()) else None


def _all_max(value: torch.Tensor) -> torch.Tensor:
    import torch.distributed as dist

    value = value.clone()
    dist.all_reduce(value, op=dist.ReduceOp.MAX)
    return value
