"""The decoding plan saved beside the weights: every layer's fitted modal tail in ``decoding_plan.safetensors``, with a
fingerprint of the weights it was fitted on, so that a loaded model decodes without fitting.

A layer's tail (:class:`~modeling_tnn.fit_modal.ModalTail`) depends only on its mixer's tail RPE, its decay
gamma and the tolerance. The file holds, per mixer that offers a modal tail (named as in the base model, e.g.
``layers.0.gtu.token_mixer``), the tensors ``<name>.poles`` and ``<name>.residues`` ((channels, modes, 2) float32: the
complex64 values' real and imaginary parts) and ``<name>.bound`` ((channels,) float64), and in the safetensors
metadata (plain strings: nothing in the file is ever executed, only tensors and JSON are read) the window, the
tolerance, the fingerprint, the mixer's structure and a digest of the numbers.

The fingerprint is a sha256 of the mixer's structure (its class, channels and the RPE's layout), gamma, and every
tail RPE parameter's name, dtype, shape and float64 value: computed once per set of weights (inside the mixer's
memo). A shipped plan is used only while the current weights give the same fingerprint (a finetuning step, a LoRA
merge, a dtype change or an edit after loading refits it). A file that cannot be read, that misses a layer, holds
wrong shapes or numbers that fail their digest, or comes from another configuration is reported in one warning
that names the layers and why; those layers fit at their first cached forward as a folder without a plan does.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from .fit_store import LayerPlan, ModalTail
from .mixer_base import TokenMixer

PLAN_FILE = "decoding_plan.safetensors"
PLAN_FORMAT = "tnn-decoding-plan/1"
PLAN_SOURCES = ("checkpoint", "fitted", "refitted")
# from_pretrained's keywords that say where a Hub file comes from.
_HUB_KEYWORDS = ("cache_dir", "force_download", "proxies", "token", "revision", "local_files_only", "subfolder")


def structure(mixer: TokenMixer) -> str:
    """What a plan's shapes and meaning depend on besides the weights' values: the mixer's class, channels, causality
    and its tail RPE's layout (module types and sizes)."""
    return f"{type(mixer).__name__}(channels={mixer.channels}, causal={mixer.causal}) {mixer.modal_tail_rpe()!r}"


def weights_fingerprint(mixer: TokenMixer) -> str:
    """sha256 of the mixer's :func:`structure`, its decay gamma and every tail RPE parameter (name, dtype, shape and
    float64 bytes): what the modal fit reads. Cheap (the RPE is small)."""
    digest = hashlib.sha256(structure(mixer).encode())
    digest.update(repr(float(mixer.ssm_kernel_decay())).encode())
    for name, parameter in mixer.modal_tail_rpe().named_parameters():
        digest.update(f"|{name}|{parameter.dtype}|{tuple(parameter.shape)}|".encode())
        digest.update(parameter.detach().to(device="cpu", dtype=torch.float64).contiguous().numpy().tobytes())
    return digest.hexdigest()


def plan_mixers(model: nn.Module) -> dict[str, TokenMixer]:
    """The causal mixers that offer a modal tail, by their name in the base model (the same for every head)."""
    base = getattr(model, "base_model", model)
    return {name: module for name, module in base.named_modules()
            if isinstance(module, TokenMixer) and module.causal and module.modal_tail_rpe() is not None}


def current_plan(mixer: TokenMixer, tolerance: float) -> LayerPlan | None:
    """The mixer's plan for ``tolerance`` that belongs to its current weights (fitted or shipped), or None."""
    candidates = mixer.decoding_plans.for_tolerance(tolerance)
    if not candidates:
        return None
    fingerprint = weights_fingerprint(mixer)
    return next((plan for plan in candidates if plan.fingerprint == fingerprint), None)


def _digest(window: int, tolerance: float, tensors: list[torch.Tensor]) -> str:
    digest = hashlib.sha256(f"{window}|{tolerance!r}".encode())
    for tensor in tensors:
        digest.update(tensor.contiguous().numpy().tobytes())
    return digest.hexdigest()


def write_plan_file(model: nn.Module, directory: str | os.PathLike, tolerance: float | None = None) -> Path | None:
    """Write ``decoding_plan.safetensors`` into ``directory`` with every layer's plan for ``tolerance`` (default the
    config's ``compact_tolerance``) that belongs to the current weights; returns its path, or None (and removes a
    stale file there) when no layer has one."""
    from safetensors.torch import save_file

    tolerance = getattr(model.config, "compact_tolerance", 1e-5) if tolerance is None else tolerance
    tensors, layers = {}, {}
    for name, mixer in plan_mixers(model).items():
        plan = current_plan(mixer, tolerance)
        if plan is None:
            continue
        tail = plan.tail
        numbers = [torch.view_as_real(tail.poles.detach().to("cpu", torch.complex64)).contiguous(),
                   torch.view_as_real(tail.residues.detach().to("cpu", torch.complex64)).contiguous(),
                   tail.bound.detach().to("cpu", torch.float64).contiguous()]
        tensors.update(zip((f"{name}.poles", f"{name}.residues", f"{name}.bound"), numbers))
        window, fitted_for = int(tail.window), float(tail.tolerance)
        layers[name] = dict(window=window, tolerance=fitted_for, fingerprint=plan.fingerprint,
                            structure=structure(mixer), digest=_digest(window, fitted_for, numbers))
    path = Path(directory) / PLAN_FILE
    if not layers:
        path.unlink(missing_ok=True)  # a plan left by an earlier save would belong to other weights
        return None
    save_file(tensors, str(path), metadata={"format": PLAN_FORMAT, "layers": json.dumps(layers, sort_keys=True)})
    return path


def _layer_from_file(name: str, entry: Any, handle: Any, keys: set[str], mixer: TokenMixer) -> LayerPlan:
    """One layer's plan from an open file, or ValueError saying what is wrong with it."""
    if not isinstance(entry, dict) or not {"window", "tolerance", "fingerprint", "structure", "digest"} <= set(entry):
        raise ValueError("its metadata entry lacks window, tolerance, fingerprint, structure or digest")
    if entry["structure"] != structure(mixer):
        raise ValueError(f"fitted for another configuration ({entry['structure']!r}, this model's mixer is "
                         f"{structure(mixer)!r})")
    window, tolerance = entry["window"], entry["tolerance"]
    if not (isinstance(window, int) and window >= 1 and isinstance(tolerance, float) and 0 < tolerance < 1):
        raise ValueError(f"window {window!r} or tolerance {tolerance!r} out of range")
    missing = [f"{name}.{part}" for part in ("poles", "residues", "bound") if f"{name}.{part}" not in keys]
    if missing:
        raise ValueError(f"the tensors {missing} are missing")
    poles, residues, bound = (handle.get_tensor(f"{name}.{part}") for part in ("poles", "residues", "bound"))
    channels = mixer.channels
    if (poles.dtype != torch.float32 or residues.dtype != torch.float32 or bound.dtype != torch.float64
            or poles.dim() != 3 or poles.shape[0] != channels or poles.shape[2] != 2 or poles.shape[1] < 1
            or residues.shape != poles.shape or bound.shape != (channels,)):
        raise ValueError(f"wrong shapes: poles {tuple(poles.shape)} {poles.dtype}, residues {tuple(residues.shape)} "
                         f"{residues.dtype}, bound {tuple(bound.shape)} {bound.dtype}; expected ({channels}, modes, 2) "
                         f"float32 twice and ({channels},) float64")
    if _digest(window, tolerance, [poles, residues, bound]) != entry["digest"]:
        raise ValueError("its numbers do not match their digest (a corrupted file)")
    poles, residues = torch.view_as_complex(poles), torch.view_as_complex(residues)
    if not (bool(torch.isfinite(torch.view_as_real(residues)).all()) and bool((poles.abs() < 1).all())
            and bool((bound >= 0).all())):
        raise ValueError("a pole on or outside the unit circle, or a residue or bound that is not finite")
    tail = ModalTail(window=window, poles=poles, residues=residues, bound=bound, tolerance=tolerance)
    if not math.isfinite(tail.max_bound):
        raise ValueError("a bound that is not finite")
    return LayerPlan(tail, str(entry["fingerprint"]), "checkpoint")


def read_plan_file(path: str | os.PathLike, mixers: dict[str, TokenMixer]) -> tuple[dict[str, LayerPlan], list[str]]:
    """The plans in ``path`` for ``mixers`` (by name), and what keeps the others from being used (one line each).
    Reads only tensors and JSON metadata (safetensors), never executes anything from the file."""
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="pt", device="cpu") as handle:
            metadata, keys = handle.metadata() or {}, set(handle.keys())
            if metadata.get("format") != PLAN_FORMAT:
                raise ValueError(f"format {metadata.get('format')!r}, expected {PLAN_FORMAT!r}")
            entries = json.loads(metadata.get("layers", "{}"))
            if not isinstance(entries, dict):
                raise ValueError("its 'layers' metadata is not a JSON object")
            plans, problems = {}, []
            for name, mixer in mixers.items():
                if name not in entries:
                    problems.append(f"{name}: missing from the file")
                    continue
                try:
                    plans[name] = _layer_from_file(name, entries[name], handle, keys, mixer)
                except ValueError as error:
                    problems.append(f"{name}: {error}")
    except Exception as error:  # noqa: BLE001 - any unreadable file: the weights load, every layer fits lazily
        return {}, [f"every layer: not a readable decoding plan ({type(error).__name__}: {error})"]
    extra = sorted(set(entries) - set(mixers))
    if extra:
        problems.append(f"the file holds layers this model does not have ({', '.join(extra)}): another configuration")
    return plans, problems


def load_plan_file(model: nn.Module | tuple, source: str | os.PathLike | None, keywords: dict[str, Any]) -> None:
    """After ``from_pretrained(source, **keywords)``: attach the plan saved beside the weights (a local folder or a
    Hub repository; none is fine) to the model's mixers, warning once about the layers it cannot serve."""
    model = model[0] if isinstance(model, tuple) else model  # output_loading_info=True
    mixers = plan_mixers(model)
    if source is None or not mixers:
        return
    from transformers.utils import cached_file

    path = cached_file(str(source), PLAN_FILE, _raise_exceptions_for_missing_entries=False,
                       _raise_exceptions_for_connection_errors=False,
                       **{key: keywords[key] for key in _HUB_KEYWORDS if keywords.get(key) is not None})
    if path is None:
        return
    plans, problems = read_plan_file(path, mixers)
    for name, plan in plans.items():
        mixers[name].decoding_plans.shipped = plan
    if problems:
        warnings.warn(f"{PLAN_FILE} of {source}: used for {len(plans)} of {len(mixers)} layers; the others fit "
                      f"their decoding plan at their first cached forward. " + "; ".join(problems),
                      UserWarning, stacklevel=3)


def save_with_plan(save: Callable[..., Any], model: nn.Module, directory: str | os.PathLike, *args, **kwargs) -> Any:
    """``save(directory, ...)`` (PreTrainedModel.save_pretrained), then the plan file beside the weights. With
    ``push_to_hub=True`` the upload follows the plan file (transformers' own upload would run before it)."""
    push = kwargs.pop("push_to_hub", False)
    hub = {key: kwargs.pop(key) for key in ("repo_id", "commit_message", "create_pr", "private")
           if push and key in kwargs}
    result = save(directory, *args, **kwargs)
    if kwargs.get("is_main_process", True):
        write_plan_file(model, directory)
    if push:  # push_to_hub saves into a temporary folder through this same path, plan included, and uploads it
        model.push_to_hub(hub.pop("repo_id", Path(directory).name), token=kwargs.get("token"), **hub)
    return result
