"""FSDP2 for the pretraining scripts (``--fsdp``): every block named in the model's ``_no_split_modules`` sharded on
its own, then the rest of the model, over all processes; checkpoints hold the sharded model and optimizer state; the
final folder holds one unsharded ``model.safetensors``.

Two ways in, one behaviour:

* GPUs: Accelerate's FSDP plugin (the :func:`fsdp_plugin` this module builds, or ``accelerate launch --use_fsdp
  --fsdp_version 2``). ``Accelerator.prepare`` shards, ``save_state`` / ``load_state`` write and read the sharded
  model and optimizer with ``torch.distributed.checkpoint``.
* CPU processes: Accelerate runs them as DDP (``MULTI_CPU``) whatever the plugin says, so the model is sharded here
  with ``torch.distributed.fsdp.fully_shard`` over the gloo process group. Accelerate still owns the data loaders,
  the schedule, gradient accumulation and the RNG states; its checkpoint hooks save and load the sharded model and
  optimizer (``torch.distributed.checkpoint``, one file per rank) beside its own files.

Either way the log says ``FSDP2: <how> on <N> ranks``, once, and only when the parameters really are sharded.
"""

from __future__ import annotations

import functools
import itertools
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from accelerate import Accelerator
from accelerate.optimizer import AcceleratedOptimizer
from accelerate.utils import DistributedType, FullyShardedDataParallelPlugin, parse_flag_from_env
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_state_dict,
    set_state_dict,
)
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import FSDPModule, fully_shard
from torch.distributed.tensor import DTensor

from ..common.flag_checks import UsageError

logger = logging.getLogger(__name__)

# The sharded model and optimizer state inside a checkpoint of the fully_shard path (torch.distributed.checkpoint:
# `.metadata` and one `__<rank>_0.distcp` per rank).
SHARDED_STATE_FOLDER = "sharded_model_optimizer"


def fsdp_plugin() -> FullyShardedDataParallelPlugin:
    """Accelerate's FSDP2 plugin as ``--fsdp`` asks for it: each ``_no_split_modules`` block its own shard unit,
    parameters resharded after forward, sharded checkpoints. Fields it leaves unset come from ``accelerate launch``
    / ``accelerate config`` (``FSDP_*`` variables), e.g. ``--fsdp_offload_params``."""
    return FullyShardedDataParallelPlugin(fsdp_version=2, auto_wrap_policy="transformer_based_wrap",
                                          reshard_after_forward=True, state_dict_type="SHARDED_STATE_DICT")


def fsdp_requested(fsdp_flag: bool, accelerator: Accelerator) -> bool:
    """Whether this run shards: ``fsdp_flag`` (``--fsdp``), Accelerate set up for FSDP (``accelerate launch --use_fsdp`` or an FSDP
    ``accelerate config`` on GPUs), or ``accelerate launch --use_fsdp`` on CPU processes, which Accelerate sets up as
    DDP (``MULTI_CPU``) but which the launcher marks with ``ACCELERATE_USE_FSDP``. (The variable alone is not enough:
    ``Accelerator(fsdp_plugin=...)`` sets it in its own process, where a later one-process run would read it.)"""
    return (fsdp_flag or accelerator.distributed_type == DistributedType.FSDP
            or (accelerator.distributed_type == DistributedType.MULTI_CPU
                and parse_flag_from_env("ACCELERATE_USE_FSDP")))


def refuse_ignored_deepspeed(accelerator: Accelerator) -> None:
    """Raise :class:`UsageError` when ``accelerate launch --use_deepspeed`` (``ACCELERATE_USE_DEEPSPEED``) asked for
    DeepSpeed but Accelerate set the run up without it: on CPU processes it runs them as plain DDP."""
    if parse_flag_from_env("ACCELERATE_USE_DEEPSPEED") and accelerator.distributed_type != DistributedType.DEEPSPEED:
        raise UsageError(f"accelerate launch --use_deepspeed: Accelerate set this run up as "
                         f"{accelerator.distributed_type.value}, without DeepSpeed (on CPU processes it runs DDP "
                         "instead of ZeRO). Shard on CPU processes with --fsdp; DeepSpeed needs GPUs.")


def is_sharded(model: torch.nn.Module) -> bool:
    """Whether ``model`` is an FSDP2 module whose parameters are DTensors."""
    return isinstance(model, FSDPModule) and any(isinstance(p, DTensor) for p in model.parameters())


def shard_units(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The submodules of ``model`` whose class ``model._no_split_modules`` names (for TNN: every ``TnnBlock``)."""
    names = set(getattr(model, "_no_split_modules", None) or ())
    return [module for module in model.modules() if type(module).__name__ in names and module is not model]


def _broadcast_from_rank0(model: torch.nn.Module) -> None:
    # set_seed(..., device_specific=True) gives every rank its own initialisation; fully_shard keeps each rank's
    # slice of its own copy, so all ranks must start from rank 0's (what DDP's constructor does for DDP).
    for tensor in itertools.chain(model.parameters(), model.buffers()):
        dist.broadcast(tensor.data, src=0)


def _autocast_forward(model: torch.nn.Module, accelerator: Accelerator) -> None:
    # What Accelerator.prepare does for a model it wraps: --mixed_precision through Accelerate's autocast.
    forward = model.forward

    @functools.wraps(forward)
    def forward_under_autocast(*args: Any, **kwargs: Any) -> Any:
        with accelerator.autocast():
            return forward(*args, **kwargs)

    model.forward = forward_under_autocast


def _register_checkpoint_hooks(accelerator: Accelerator, model: torch.nn.Module,
                               optimizer: torch.optim.Optimizer) -> None:
    """``save_state`` / ``load_state`` call these on every rank: the sharded model and optimizer state go to and
    come from ``SHARDED_STATE_FOLDER`` of the checkpoint, each rank writing and reading its own shards."""

    def save(models: list, weights: list, output_dir: str) -> None:
        model_state, optimizer_state = get_state_dict(model, optimizer)
        dcp.save({"model": model_state, "optimizer": optimizer_state},
                 checkpoint_id=Path(output_dir) / SHARDED_STATE_FOLDER)

    def load(models: list, input_dir: str) -> None:
        folder = Path(input_dir) / SHARDED_STATE_FOLDER
        if not folder.is_dir():
            raise UsageError(f"--resume_from_checkpoint {input_dir!r} holds no sharded model state "
                             f"({SHARDED_STATE_FOLDER}/): it was not written by an --fsdp run on CPU processes.")
        model_state, optimizer_state = get_state_dict(model, optimizer)
        state = {"model": model_state, "optimizer": optimizer_state}
        dcp.load(state, checkpoint_id=folder)
        set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"])

    accelerator.register_save_state_pre_hook(save)
    accelerator.register_load_state_pre_hook(load)


def prepare_sharded(accelerator: Accelerator, model: torch.nn.Module,
                    new_optimizer: Callable[[torch.nn.Module], torch.optim.Optimizer],
                    *dataloaders: Any) -> tuple[Any, ...]:
    """``accelerator.prepare(model, optimizer, *dataloaders)`` with the model sharded by FSDP2.

    ``new_optimizer(model)`` builds the optimizer; it is called once the parameters it must hold exist (after
    ``fully_shard`` on CPU, where the parameters become DTensors). Raises :class:`UsageError` for a run of one
    process, which has nothing to shard over."""
    if accelerator.num_processes < 2:
        raise UsageError("--fsdp shards the model over several processes; this run has one. Launch it with "
                         "`accelerate launch --num_processes N ...` or `torchrun --nproc_per_node N ...`.")
    if accelerator.distributed_type == DistributedType.FSDP:  # GPUs: Accelerate's FSDP plugin shards
        _broadcast_from_rank0(model.to(accelerator.device))
        model, optimizer, *dataloaders = accelerator.prepare(model, new_optimizer(model), *dataloaders)
        how = f"Accelerate's FSDP plugin ({dist.get_backend()})"
    elif accelerator.distributed_type == DistributedType.MULTI_CPU:  # Accelerate would run DDP: shard here
        _broadcast_from_rank0(model)
        mesh = init_device_mesh("cpu", (accelerator.num_processes,))
        for unit in shard_units(model):
            fully_shard(unit, mesh=mesh)
        fully_shard(model, mesh=mesh)
        if accelerator.mixed_precision != "no":
            _autocast_forward(model, accelerator)
        inner = new_optimizer(model)
        _register_checkpoint_hooks(accelerator, model, inner)
        # Accelerate's wrapper, not registered with the accelerator (its save_state would pickle rank 0's shards):
        # it skips the step and zero_grad between accumulated micro-batches, as for the other paths.
        optimizer = AcceleratedOptimizer(inner, device_placement=False, scaler=accelerator.scaler)
        dataloaders = [accelerator.prepare(loader) for loader in dataloaders]
        how = f"fully_shard ({dist.get_backend()})"
    else:
        raise UsageError(f"--fsdp: Accelerate set this run up as {accelerator.distributed_type.value}, which FSDP2 "
                         "cannot shard (GPUs through `accelerate launch --use_fsdp --fsdp_version 2`, or CPU "
                         "processes through torchrun / `accelerate launch --cpu`).")
    if is_sharded(model) and accelerator.is_main_process:
        logger.info("FSDP2: %s on %d ranks", how, accelerator.num_processes)
    return (model, optimizer, *dataloaders)


def full_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The unsharded state dict of an FSDP2 model, on CPU, on the main process (empty elsewhere). Every rank must
    call it: it gathers the shards."""
    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))


def save_unsharded(model: torch.nn.Module, accelerator: Accelerator, output_dir: Path) -> torch.nn.Module:
    """Gather ``model``'s shards into a plain (unsharded) copy of it on the main process and ``save_pretrained`` that
    into ``output_dir``: one ``model.safetensors``, tied weights stored once, the model code of a remote-code model.
    Every rank must call this. Returns the plain copy on the main process (what runs there alone after training,
    samples and timings, needs whole weights), ``model`` itself elsewhere."""
    state_dict = full_state_dict(model)
    if not accelerator.is_main_process:
        return model
    # fully_shard swaps the class for FSDP<name>(FSDPModule, <name>); saving from it would copy torch's modules.
    plain_class = next(cls for cls in type(model).__mro__ if not issubclass(cls, FSDPModule))
    plain = plain_class(model.config)
    plain.load_state_dict(state_dict)
    plain.save_pretrained(output_dir, save_function=accelerator.save)
    return plain
