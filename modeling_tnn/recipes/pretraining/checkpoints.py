"""The run folder of the pretraining scripts: atomic checkpoints, finding and rotating them, what marks a folder as
holding a run, and the fingerprints that refuse a resume by another run."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
from pathlib import Path
from typing import Any

import torch
from accelerate import Accelerator
from transformers import (
    PreTrainedTokenizerBase,
)

from ..common.flag_checks import UsageError
from ..common.run_files import CONFIG_FILE, LENGTHS_PLOT, METRICS_FILE, RESULTS_FILE, TRAINER_STATE, WEIGHT_FILE

TMP_PREFIX = ".tmp-"  # checkpoints are written under this prefix, then renamed
CHECKPOINT_NAME = re.compile(r"^(step|epoch)_(\d+)$")
# What a run leaves in --output_dir; any of these (or a checkpoint folder) marks the folder as holding a run.
RUN_FILES = (CONFIG_FILE, WEIGHT_FILE, "tokenizer.json", "tokenizer_config.json", METRICS_FILE, RESULTS_FILE)
# Config fields that are bookkeeping rather than the model: a resumed run may differ in these.
CONFIG_BOOKKEEPING = {"transformers_version", "_name_or_path", "architectures", "auto_map", "dtype", "torch_dtype",
                      "use_cache", "return_dict", "output_hidden_states", "output_attentions", "_commit_hash",
                      "_attn_implementation_autoset", "_attn_implementation", "generation_cache"}


def is_valid_checkpoint(folder: str | Path) -> bool:
    """A checkpoint is valid when its folder holds ``trainer_state.json``, which is written last."""
    return Path(folder).is_dir() and (Path(folder) / TRAINER_STATE).is_file()


def find_latest_checkpoint(output_dir: str | Path) -> Path | None:
    """The valid ``step_*``/``epoch_*`` checkpoint of ``output_dir`` with the most completed steps, if any."""
    found = list_checkpoints(output_dir)
    return found[-1] if found else None


def resolve_checkpoint(value: str, output_dir: str) -> Path:
    """The folder ``--resume_from_checkpoint value`` names (``latest`` = newest valid one in ``output_dir``)."""
    if value == "latest":
        found = find_latest_checkpoint(output_dir)
        if found is None:
            raise UsageError(f"--resume_from_checkpoint latest: no valid checkpoint in {output_dir!r}.")
        return found
    if not Path(value).is_dir():
        raise UsageError(f"--resume_from_checkpoint {value!r} does not exist.")
    if not is_valid_checkpoint(value):
        raise UsageError(f"--resume_from_checkpoint {value!r} is not a complete checkpoint (no {TRAINER_STATE}).")
    return Path(value)


def _fsync_tree(folder: Path) -> None:
    # Flush file contents before the rename, so a power loss cannot leave a renamed folder with empty files.
    for path in folder.rglob("*"):
        if path.is_file():
            with open(path, "rb") as handle:
                os.fsync(handle.fileno())


def _fsync_dir(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:  # not every platform can open a directory
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def save_checkpoint(accelerator: Accelerator, output_dir: Path, name: str, state: dict[str, Any],
                    tokenizer: PreTrainedTokenizerBase) -> Path:
    """Write ``output_dir/name`` atomically: everything goes into ``.tmp-name`` (``trainer_state.json`` last), which
    is then renamed. A crash at any point leaves either the previous folder or a ``.tmp-`` folder that is never read.
    Every process must call this (each saves its own RNG state)."""
    final, tmp = output_dir / name, output_dir / f"{TMP_PREFIX}{name}"
    if accelerator.is_main_process:
        shutil.rmtree(tmp, ignore_errors=True)  # a leftover of an earlier crash
        tmp.mkdir(parents=True)
    accelerator.wait_for_everyone()
    accelerator.save_state(str(tmp))
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        tokenizer.save_pretrained(tmp)
        (tmp / TRAINER_STATE).write_text(json.dumps(state, indent=2))
        _fsync_tree(tmp)
        if final.exists():  # rename cannot replace a non-empty folder: move the old one aside first
            old = output_dir / f"{TMP_PREFIX}old-{name}"
            shutil.rmtree(old, ignore_errors=True)
            os.replace(final, old)
            os.replace(tmp, final)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, final)
        _fsync_dir(output_dir)
    accelerator.wait_for_everyone()
    return final


def _checkpoint_steps(folder: Path) -> int:
    try:
        return int(json.loads((folder / TRAINER_STATE).read_text())["completed_steps"])
    except (OSError, ValueError, KeyError):
        return -1


def list_checkpoints(output_dir: str | Path) -> list[Path]:
    """The valid ``step_*``/``epoch_*`` checkpoints of ``output_dir``, oldest first (by completed steps)."""
    folder = Path(output_dir)
    if not folder.is_dir():
        return []
    found = [child for child in folder.iterdir() if CHECKPOINT_NAME.match(child.name) and is_valid_checkpoint(child)]
    return sorted(found, key=lambda child: (_checkpoint_steps(child), child.name.startswith("step_"), child.name))


def remove_checkpoint(folder: Path) -> None:
    """Delete a checkpoint without ever leaving a half-deleted folder that still looks valid: it is first renamed
    to a ``.tmp-`` name (atomic), which is never resumed from, then removed."""
    doomed = folder.parent / f"{TMP_PREFIX}deleted-{folder.name}"
    shutil.rmtree(doomed, ignore_errors=True)
    os.replace(folder, doomed)
    shutil.rmtree(doomed, ignore_errors=True)


def rotate_checkpoints(output_dir: str | Path, keep: int) -> list[Path]:
    """Delete all but the newest ``keep`` valid checkpoints of ``output_dir``; returns the deleted folders."""
    doomed = list_checkpoints(output_dir)[:-keep] if keep > 0 else []
    for folder in doomed:
        remove_checkpoint(folder)
    return doomed


def run_files_in(output_dir: str | Path) -> list[str]:
    """The names of what a run leaves in ``output_dir`` (checkpoints, partial ``.tmp-`` checkpoints, the model,
    the tokenizer, the logs), sorted; empty for a missing or unrelated folder."""
    folder = Path(output_dir)
    if not folder.is_dir():
        return []
    found = [child.name for child in folder.iterdir()
             if child.name in RUN_FILES
             or (child.is_dir() and (CHECKPOINT_NAME.match(child.name) or child.name.startswith(TMP_PREFIX)))]
    # checkpoints first, by step, then files
    return sorted(found, key=lambda name: (not CHECKPOINT_NAME.match(name),
                                           [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", name)]))


def clear_previous_run(output_dir: str | Path) -> list[str]:
    """--overwrite_output_dir: delete the previous run's checkpoints (complete and partial) and result logs, so that
    a later ``--resume_from_checkpoint latest`` can only find this run's. The model and tokenizer files are replaced
    by the new run's at its end. Returns what was deleted."""
    folder, deleted = Path(output_dir), []
    for name in run_files_in(folder):
        path = folder / name
        if path.is_dir():
            if is_valid_checkpoint(path):
                remove_checkpoint(path)
            else:
                shutil.rmtree(path, ignore_errors=True)
            deleted.append(name)
    for name in (METRICS_FILE, RESULTS_FILE, LENGTHS_PLOT):
        if (folder / name).is_file():
            (folder / name).unlink()
            deleted.append(name)
    return deleted


def tokenizer_fingerprint(tokenizer: PreTrainedTokenizerBase) -> dict[str, Any]:
    """``{"size": len(tokenizer), "sha256": ...}``: a hash of the vocabulary (token -> id) and the special tokens,
    recorded in every checkpoint so that a resume with another tokenizer is refused."""
    vocab = sorted(tokenizer.get_vocab().items(), key=lambda item: (item[1], item[0]))
    payload = json.dumps({"vocab": vocab, "special_tokens": tokenizer.special_tokens_map}, sort_keys=True,
                         ensure_ascii=False, default=str)
    return {"size": len(tokenizer), "sha256": hashlib.sha256(payload.encode("utf-8")).hexdigest()}


def model_fingerprint(model: torch.nn.Module) -> dict[str, Any]:
    """The config fields that define the model (every field of ``model.config`` but bookkeeping such as
    ``transformers_version`` or ``use_cache``), as JSON values; recorded in every checkpoint."""
    config = json.loads(model.config.to_json_string(use_diff=False))
    return {key: value for key, value in sorted(config.items()) if key not in CONFIG_BOOKKEEPING}


def checkpoint_differences(saved: dict[str, Any], current: dict[str, Any]) -> list[str]:
    """``["token_mixer 'dense' -> 'fd', ...]``: the fields of a checkpoint's ``trainer_state.json`` (``saved``) that
    differ from this run's (``current``), each as ``name old -> new``. Sections or fields the checkpoint lacks (it
    predates them) are not compared."""
    differences = []
    for section, prefix in (("model_config", ""), ("tokenizer", "tokenizer "), ("geometry", "")):
        old, new = saved.get(section), current.get(section)
        if not isinstance(old, dict) or not isinstance(new, dict):
            continue
        for key in sorted(set(old) & set(new), key=list(new).index):
            if old[key] != new[key]:
                if section == "tokenizer" and key == "sha256":
                    differences.append(f"tokenizer vocabulary sha256 {old[key][:12]} -> {new[key][:12]}")
                else:
                    differences.append(f"{prefix}{key} {old[key]!r} -> {new[key]!r}")
    return differences
