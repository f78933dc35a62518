"""What :func:`.setup.setup` hands on, so that the parsed flags stop there: the :class:`Session` (the prepared model,
data and optimizer, and the run's counters), the loop's :class:`Schedule`, the :class:`FinishSpec` of what happens
after the last step, and what each stage returns (:class:`LoopResult`, :class:`RunOutcome`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from accelerate import Accelerator
from torch.utils.data import DataLoader
from transformers import PreTrainedTokenizerBase

from ..hub.run_inspection import DatasetRef
from .evaluation import InputBuilder
from .tracking import MetricsLog


@dataclass(frozen=True)
class Schedule:
    """How the loop runs: its length, accumulation and clipping, the cadence of logs, evaluations and checkpoints
    (written into ``output_dir``), and the seed of the evaluations."""

    max_train_steps: int
    steps_per_epoch: int
    num_train_epochs: int
    gradient_accumulation_steps: int
    max_grad_norm: float  # 0: no clipping
    logging_steps: int
    eval_steps: int | None  # None: evaluate at each epoch's end
    checkpoint_every: int | None  # a step count, or None
    checkpoint_each_epoch: bool
    checkpoints_total_limit: int | None
    output_dir: Path
    seed: int


@dataclass(frozen=True)
class FinishSpec:
    """What happens after the last step: the final save into ``output_dir``, the length evaluation, samples and
    generation timing, the Hub upload (``hub_repo_id`` ``None``: none)."""

    output_dir: Path
    block_size: int
    eval_batch_size: int
    seed: int
    eval_lengths: list[int] = field(default_factory=list)
    sample_prompts: list[str] = field(default_factory=list)
    sample_max_new_tokens: int = 0
    time_generation: list[int] = field(default_factory=list)
    hub_repo_id: str | None = None
    dataset: DatasetRef | None = None  # what the model card names as the evaluation data


@dataclass
class Session:
    """Everything :func:`.setup.setup` prepared for the loop and the finish; ``completed_steps`` and ``tokens_seen``
    are what a checkpoint restores."""

    task: str
    accelerator: Accelerator
    model: torch.nn.Module
    tokenizer: PreTrainedTokenizerBase
    optimizer: torch.optim.Optimizer
    scheduler: Any
    train_dataloader: DataLoader
    eval_dataloader: DataLoader
    build_inputs: InputBuilder
    metrics: MetricsLog
    eval_stream: torch.Tensor | None
    schedule: Schedule
    finish: FinishSpec
    completed_steps: int = 0
    tokens_seen: int = 0
    fingerprint: dict[str, Any] = field(default_factory=dict)  # model config and tokenizer, see checkpoints
    geometry: dict[str, Any] = field(default_factory=dict)  # the data layout a resumed run must repeat
    sharded: bool = False  # --fsdp: the model is an FSDP2 module (see sharding.prepare_sharded)


@dataclass
class LoopResult:
    """What the loop measured: the last evaluation, the mean training loss of this process's batches, the loop's
    wall time and tokens per second, and the epoch it stopped in."""

    eval_metrics: dict[str, float]
    train_loss: float
    runtime: float
    tokens_per_second: float
    epoch: int


@dataclass
class RunOutcome:
    """What :func:`.training.run` returns: ``results`` (as written to all_results.json), the trained (unwrapped)
    model, the tokenizer, and the validation token stream when --eval_lengths was given."""

    results: dict[str, Any]
    model: torch.nn.Module
    tokenizer: PreTrainedTokenizerBase
    eval_stream: torch.Tensor | None = None
    samples: list[str] = field(default_factory=list)
