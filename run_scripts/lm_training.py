"""The machinery shared by ``train_clm.py`` and ``train_mlm.py``: Accelerate pretraining of causal and masked TNN
language models with the flags of Hugging Face's ``run_clm_no_trainer.py`` / ``run_mlm_no_trainer.py``.

One module holds everything the two scripts share: argument parsing and validation, data loading (Hub dataset, local
files or the embedded corpus), tokenizer training, ``group_texts``, the training loop, evaluation, atomic checkpoints
with exact resume (model, optimizer, scheduler, RNG and data position), JSONL metric logging, ``all_results.json``,
length-extrapolation evaluation with a plot, and pushing to the Hub. The scripts only pick the task.

Programmatic use (the quality benchmark does this)::

    args = parse_args("clm", ["--config_name", "tiny", "--max_train_steps", "10"])
    outcome = run(args, "clm", raw_datasets=my_dataset_dict)   # outcome.results is all_results.json
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import math
import os
import re
import shutil
import signal
import statistics
import sys
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from functools import partial
from itertools import chain
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from accelerate import Accelerator
from accelerate.utils import set_seed
from datasets import Dataset, DatasetDict, load_dataset
from torch.utils.data import DataLoader, Sampler
from tqdm.auto import tqdm
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoModelForMaskedLM,
    AutoTokenizer,
    DataCollatorForLanguageModeling,
    PreTrainedTokenizerBase,
    SchedulerType,
    default_data_collator,
    get_scheduler,
)

import modeling_tnn  # noqa: F401  (registers model_type "tnn" with the Auto classes)
from modeling_tnn import list_presets, load_preset
from modeling_tnn.corpus import embedded_splits
from modeling_tnn.tokenizer_training import train_byte_level_bpe

logger = logging.getLogger("lm_training")

TASKS = ("clm", "mlm")
DEFAULT_CONFIG = "small"
TRAINER_STATE = "trainer_state.json"  # written last into a checkpoint: its presence marks a complete checkpoint
TMP_PREFIX = ".tmp-"  # checkpoints are written under this prefix, then renamed
CHECKPOINT_NAME = re.compile(r"^(step|epoch)_(\d+)$")
TEXT_EXTENSIONS = {"txt": "text", "text": "text", "raw": "text", "tokens": "text", "csv": "csv", "json": "json",
                   "jsonl": "json"}
METRICS_FILE = "metrics.jsonl"
RESULTS_FILE = "all_results.json"
# What a run leaves in --output_dir; any of these (or a checkpoint folder) marks the folder as holding a run.
RUN_FILES = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", METRICS_FILE,
             RESULTS_FILE)
# Config fields that are bookkeeping rather than the model: a resumed run may differ in these.
CONFIG_BOOKKEEPING = {"transformers_version", "_name_or_path", "architectures", "auto_map", "dtype", "torch_dtype",
                      "use_cache", "return_dict", "output_hidden_states", "output_attentions", "_commit_hash",
                      "_attn_implementation_autoset", "_attn_implementation", "generation_cache"}
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "vocab.txt", "tokenizer.model",
                   "spiece.model", "sentencepiece.bpe.model")
EXIT_CODES = {"SIGINT": 130, "SIGTERM": 143}  # 128 + the signal number, as shells report a signal death


class UsageError(ValueError):
    """A bad flag value, found before training starts (the CLI prints it and exits with status 2)."""


class TrainingInterrupted(KeyboardInterrupt):
    """SIGINT or SIGTERM stopped training after a checkpoint of the current step was written (``checkpoint``); the
    CLI prints one line saying how to resume and exits with ``exit_code`` (130 for SIGINT, 143 for SIGTERM). A
    ``KeyboardInterrupt``, so that callers' ``except Exception`` blocks do not swallow the user's stop."""

    def __init__(self, signal_name: str, step: int, checkpoint: Path):
        self.signal_name, self.step, self.checkpoint = signal_name, step, checkpoint
        self.exit_code = EXIT_CODES.get(signal_name, 1)
        super().__init__(f"{signal_name} at step {step}: saved checkpoint {checkpoint}; resume with "
                         f"--resume_from_checkpoint {checkpoint}")


# ---------------------------------------------------------------------------------------------------------------
# Arguments
# ---------------------------------------------------------------------------------------------------------------
def build_parser(task: str) -> argparse.ArgumentParser:
    """The argument parser of ``train_clm.py`` (``task="clm"``) or ``train_mlm.py`` (``task="mlm"``)."""
    if task not in TASKS:
        raise ValueError(f"task must be one of {TASKS}, got {task!r}.")
    kind = "a causal" if task == "clm" else "a masked (bidirectional)"
    parser = argparse.ArgumentParser(
        description=f"Pretrain {kind} TNN language model with Accelerate. Without --dataset_name or --train_file it "
        "trains on the embedded default corpus (CPython's pydoc_data.topics).")

    data = parser.add_argument_group("data")
    data.add_argument("--dataset_name", help="a Hub dataset (needs the network)")
    data.add_argument("--dataset_config_name", help="the configuration of --dataset_name")
    data.add_argument("--train_file", help="a local .txt/.csv/.json(l) training file")
    data.add_argument("--validation_file", help="a local validation file (default: a split of the training data)")
    data.add_argument("--validation_split_percentage", type=int,
                      help="%% of the training data held out when there is no validation split (default 5; 10 for "
                           "the embedded corpus)")
    data.add_argument("--no_keep_linebreaks", action="store_true", help="drop line breaks of .txt files")
    data.add_argument("--text_column", help="the text column (default: 'text', else the first column)")
    data.add_argument("--max_eval_samples", type=int, help="evaluate on at most this many blocks (periodic eval)")
    data.add_argument("--preprocessing_num_workers", type=int, help="processes for tokenization")

    model = parser.add_argument_group("model and tokenizer")
    model.add_argument("--model_name_or_path", help="continue training from a saved model folder")
    model.add_argument("--config_name", default=None,
                       help=f"a preset ({', '.join(list_presets())}), a JSON file or a folder with config.json "
                            f"(default: {DEFAULT_CONFIG})")
    model.add_argument("--config_overrides", help='comma-separated k=v config fields, e.g. "hidden_size=64,dropout=0"; '
                                                  "values are parsed as JSON where possible")
    model.add_argument("--tokenizer_name", help="a tokenizer folder; without it a byte-level BPE is trained on the "
                                                "training split")
    model.add_argument("--vocab_size", type=int, default=8192,
                       help="vocabulary of the trained BPE (261 = bytes + specials, no merges: character level)")
    model.add_argument("--trust_remote_code", action="store_true", help="allow model code from the model folder")

    train = parser.add_argument_group("training")
    train.add_argument("--block_size", type=int, default=256, help="training sequence length in tokens")
    train.add_argument("--per_device_train_batch_size", type=int, default=8)
    train.add_argument("--per_device_eval_batch_size", type=int, default=8)
    train.add_argument("--gradient_accumulation_steps", type=int, default=1)
    train.add_argument("--learning_rate", type=float, default=1e-3,
                       help="peak learning rate (from-scratch default, higher than HF's fine-tuning 5e-5)")
    train.add_argument("--weight_decay", type=float, default=0.0, help="AdamW weight decay (not on biases/norms)")
    train.add_argument("--max_grad_norm", type=float, default=1.0, help="gradient clipping; 0 disables it")
    train.add_argument("--num_warmup_steps", type=int, default=0)
    train.add_argument("--lr_scheduler_type", default="linear", choices=[t.value for t in SchedulerType])
    train.add_argument("--num_train_epochs", type=int, default=3)
    train.add_argument("--max_train_steps", type=int, help="optimizer steps; overrides --num_train_epochs")
    train.add_argument("--seed", type=int, default=42)
    train.add_argument("--mixed_precision", choices=["no", "fp16", "bf16"],
                       help="default: what `accelerate launch`/`accelerate config` says, else no")

    track = parser.add_argument_group("evaluation, checkpoints and outputs")
    track.add_argument("--output_dir", default=f"outputs/train_{task}")
    track.add_argument("--overwrite_output_dir", action="store_true",
                       help="start a new run in an --output_dir that holds another run: its checkpoints, "
                            f"{METRICS_FILE} and {RESULTS_FILE} are deleted first (without this flag such a folder "
                            "is refused unless you resume)")
    track.add_argument("--checkpointing_steps", help="an integer (every n steps) or 'epoch'")
    track.add_argument("--checkpoints_total_limit", type=int,
                       help="keep only the newest N checkpoints (older ones are deleted after each save)")
    track.add_argument("--resume_from_checkpoint",
                       help="a checkpoint folder, or 'latest' (newest in --output_dir); its model config, tokenizer "
                            "and data geometry must match this run")
    track.add_argument("--eval_steps", type=int, help="evaluate every n steps (default: each epoch and the end)")
    track.add_argument("--logging_steps", type=int, default=10, help="log the training loss every n steps")
    track.add_argument("--eval_lengths",
                       help="comma-separated evaluation lengths, e.g. 512,1024,2048,4096: validation perplexity "
                            "at each (full windows; sliding windows for models with a position table)")
    track.add_argument("--report_to", default="tensorboard",
                       help="trackers besides the JSONL file: 'tensorboard', 'wandb', ..., 'all' or 'none' "
                            "(a tracker whose package is missing is skipped)")
    track.add_argument("--with_tracking", action="store_true", help=argparse.SUPPRESS)  # HF compatibility, no-op
    track.add_argument("--push_to_hub", action="store_true",
                       help="publish the final model to the Hub (model card included, via hub_publishing.py)")
    track.add_argument("--hub_model_id", help="repository id for --push_to_hub (default: --output_dir's name)")

    if task == "mlm":
        parser.add_argument("--mlm_probability", type=float, default=0.15, help="fraction of tokens masked")
    else:
        parser.add_argument("--sample_prompt", action="append",
                            help="after training, generate a continuation of this prompt (repeatable)")
        parser.add_argument("--sample_max_new_tokens", type=int, default=60)
        parser.add_argument("--time_generation",
                            help="after training, print the per-token generation time at these comma-separated "
                                 "context lengths (e.g. 128,512,2048), with the recurrent cache and with a full "
                                 "recompute per token")
    return parser


def parse_args(task: str, argv: list[str] | None = None) -> argparse.Namespace:
    """Parse ``argv`` (default: ``sys.argv[1:]``) for ``task`` and record the task on the namespace."""
    args = build_parser(task).parse_args(argv)
    args.task = task
    return args


def parse_config_overrides(text: str | None) -> dict[str, Any]:
    """``"a=1,b=fd,c=null"`` -> ``{"a": 1, "b": "fd", "c": None}``: values are JSON where they parse, else strings."""
    overrides: dict[str, Any] = {}
    if not text:
        return overrides
    for item in text.split(","):
        if not item.strip():
            continue
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise UsageError(f"--config_overrides expects comma-separated key=value pairs, got {item!r}.")
        try:
            overrides[key.strip()] = json.loads(value.strip())
        except json.JSONDecodeError:
            overrides[key.strip()] = value.strip()
    return overrides


def parse_lengths(text: str | None, flag: str = "--eval_lengths") -> list[int]:
    """``"512,1024"`` -> ``[512, 1024]`` (sorted, unique); each must be an integer >= 2."""
    if not text:
        return []
    try:
        lengths = sorted({int(x) for x in text.split(",") if x.strip()})
    except ValueError:
        raise UsageError(f"{flag} must be comma-separated integers, got {text!r}.") from None
    if not lengths or lengths[0] < 2:
        raise UsageError(f"{flag} values must be integers >= 2, got {text!r}.")
    return lengths


def _first_line(error: BaseException) -> str:
    """The first non-empty line of an exception's message (library errors often span many lines)."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    return lines[0] if lines else type(error).__name__


def _name_list(names: list[str], limit: int = 4) -> str:
    shown = ", ".join(names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")


def looks_like_local_path(value: str) -> bool:
    """Whether a --model_name_or_path/--config_name/--tokenizer_name value names a local file or folder rather than
    a Hub id: it exists, starts with '.', '/' or '~', ends with a separator, has more than one separator, or its
    first component is an existing folder (``outputs/run``). A Hub id is ``name`` or ``org/name``."""
    if Path(value).expanduser().exists():
        return True
    normalised = value.replace(os.sep, "/")
    if normalised.startswith((".", "/", "~")) or normalised.endswith("/"):
        return True
    parts = normalised.split("/")
    return len(parts) > 2 or (len(parts) == 2 and Path(parts[0]).is_dir())


def check_local_path(flag: str, value: str, what: str = "folder") -> None:
    """Raise :class:`UsageError` naming the first missing folder when ``value`` looks local but does not exist (so
    a typo reports the path, not a failed connection to the Hub)."""
    if not looks_like_local_path(value):
        return
    path = Path(value).expanduser()
    if path.exists():
        return
    missing = path
    for parent in path.parents:  # the shortest prefix that does not exist
        if str(parent) not in ("", ".") and not parent.exists():
            missing = parent
    if missing == path:
        raise UsageError(f"{flag} {value!r}: no such {what}.")
    raise UsageError(f"{flag} {value!r}: no such folder {str(missing)!r}.")


def _hub_hint(value: str) -> str:
    """For an error loading ``value``: says that no local folder has that name (so it was looked up on the Hub)."""
    return "" if Path(value).expanduser().exists() else "there is no local folder of that name, and as a Hub id: "


def check_model_folder(value: str) -> None:
    """--model_name_or_path: a local value must be a folder holding ``config.json`` (a saved model)."""
    check_local_path("--model_name_or_path", value)
    path = Path(value).expanduser()
    if not path.exists():
        return  # a Hub id
    if not path.is_dir():
        raise UsageError(f"--model_name_or_path {value!r} is a file; it takes a saved model folder.")
    if not (path / "config.json").is_file():
        hint = (f"; it is a training checkpoint: resume it with --resume_from_checkpoint {value}"
                if is_valid_checkpoint(path) else "")
        raise UsageError(f"--model_name_or_path {value!r} is a folder without config.json (not a saved model){hint}.")


def _data_file_type(path: str, flag: str) -> str:
    if not Path(path).is_file():
        raise UsageError(f"{flag} {path!r} does not exist (or is not a file).")
    extension = path.rsplit(".", 1)[-1].lower() if "." in Path(path).name else ""
    if extension not in TEXT_EXTENSIONS:
        raise UsageError(f"{flag} {path!r}: unsupported extension {extension!r}; use one of "
                         f"{sorted(TEXT_EXTENSIONS)}.")
    return TEXT_EXTENSIONS[extension]


def check_args(args: argparse.Namespace) -> None:
    """Raise :class:`UsageError` for flag values that cannot work, before anything heavy happens."""
    positive = ["block_size", "per_device_train_batch_size", "per_device_eval_batch_size",
                "gradient_accumulation_steps", "num_train_epochs", "logging_steps"]
    for name in positive + ["max_train_steps", "eval_steps", "max_eval_samples"]:
        value = getattr(args, name)
        if (name in positive or value is not None) and (value is None or value < 1):
            raise UsageError(f"--{name} must be a positive integer, got {value}.")
    if args.block_size < 2:
        raise UsageError(f"--block_size must be at least 2, got {args.block_size}.")
    if args.learning_rate <= 0 or args.weight_decay < 0 or args.num_warmup_steps < 0 or args.max_grad_norm < 0:
        raise UsageError("--learning_rate must be > 0 and --weight_decay, --num_warmup_steps, --max_grad_norm >= 0.")
    if args.validation_split_percentage is not None and not 0 < args.validation_split_percentage < 100:
        raise UsageError(f"--validation_split_percentage must lie in (0, 100), got {args.validation_split_percentage}.")
    if args.dataset_name and args.train_file:
        raise UsageError("Pass either --dataset_name or --train_file, not both.")
    if args.validation_file and not args.train_file:
        raise UsageError("--validation_file needs --train_file.")
    if args.train_file:
        kind = _data_file_type(args.train_file, "--train_file")
        if args.validation_file and _data_file_type(args.validation_file, "--validation_file") != kind:
            raise UsageError("--train_file and --validation_file must have the same format.")
        for flag in ("train_file", "validation_file"):
            path = getattr(args, flag)
            if path and Path(path).stat().st_size == 0:
                raise UsageError(f"--{flag} {path!r} is empty.")
    if args.model_name_or_path:
        if args.config_name or args.config_overrides:
            raise UsageError("--config_name/--config_overrides build a new model; they cannot be combined with "
                             "--model_name_or_path (which continues from a saved one).")
        check_model_folder(args.model_name_or_path)
    if args.config_name:
        check_local_path("--config_name", args.config_name, "file or folder")
    if args.tokenizer_name:
        check_local_path("--tokenizer_name", args.tokenizer_name)
    if args.vocab_size < 261:
        raise UsageError(f"--vocab_size must be at least 261 (256 bytes + 5 special tokens), got {args.vocab_size}.")
    if args.checkpoints_total_limit is not None and args.checkpoints_total_limit < 1:
        raise UsageError(f"--checkpoints_total_limit must be a positive integer, got {args.checkpoints_total_limit}.")
    if args.checkpointing_steps is not None and args.checkpointing_steps != "epoch":
        if not args.checkpointing_steps.isdigit() or int(args.checkpointing_steps) < 1:
            raise UsageError(f"--checkpointing_steps must be a positive integer or 'epoch', "
                             f"got {args.checkpointing_steps!r}.")
    args.eval_lengths_list = parse_lengths(args.eval_lengths)
    if args.task == "mlm" and not 0 < args.mlm_probability < 1:
        raise UsageError(f"--mlm_probability must lie in (0, 1), got {args.mlm_probability}.")
    args.time_generation_list = parse_lengths(getattr(args, "time_generation", None), "--time_generation")
    if args.resume_from_checkpoint:
        if args.overwrite_output_dir:
            raise UsageError("--overwrite_output_dir starts a new run; it cannot be combined with "
                             "--resume_from_checkpoint.")
        args.resume_path = resolve_checkpoint(args.resume_from_checkpoint, args.output_dir)
    else:
        args.resume_path = None
        # Every process checks before any of them writes: Accelerator() (a rendezvous) comes after this.
        found = run_files_in(args.output_dir)
        if found and not args.overwrite_output_dir:
            raise UsageError(f"--output_dir {args.output_dir!r} already holds a run ({_name_list(found)}): resume it "
                             "with --resume_from_checkpoint latest, or pass --overwrite_output_dir to start a new "
                             "run there.")
    if args.push_to_hub:
        check_push_to_hub(args)


# ---------------------------------------------------------------------------------------------------------------
# Checkpoints
# ---------------------------------------------------------------------------------------------------------------
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
    for name in (METRICS_FILE, RESULTS_FILE, "eval_lengths.png"):
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


# ---------------------------------------------------------------------------------------------------------------
# Data
# ---------------------------------------------------------------------------------------------------------------
class EpochShuffleSampler(Sampler[int]):
    """A permutation that depends only on ``seed + epoch``, never on the global RNG: a resumed run sees the same
    order, and every process of a distributed run shuffles identically (Accelerate then shards the batches)."""

    def __init__(self, num_samples: int, seed: int):
        self.num_samples, self.seed, self.epoch = num_samples, seed, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return self.num_samples

    def __iter__(self) -> Iterator[int]:
        generator = torch.Generator().manual_seed(self.seed + self.epoch)
        yield from torch.randperm(self.num_samples, generator=generator).tolist()


def load_raw_datasets(args: argparse.Namespace) -> DatasetDict:
    """``train`` and ``validation`` splits from the Hub, local files, or the embedded corpus (in that order)."""
    if args.dataset_name:
        raw = load_dataset(args.dataset_name, args.dataset_config_name)
        if "validation" not in raw:
            p = args.validation_split_percentage or 5
            raw["validation"] = load_dataset(args.dataset_name, args.dataset_config_name, split=f"train[:{p}%]")
            raw["train"] = load_dataset(args.dataset_name, args.dataset_config_name, split=f"train[{p}%:]")
        return raw
    if args.train_file:
        kind = _data_file_type(args.train_file, "--train_file")
        files = {"train": args.train_file}
        if args.validation_file:
            files["validation"] = args.validation_file
        extra = {"keep_linebreaks": not args.no_keep_linebreaks} if kind == "text" else {}
        names = " / ".join(f"--{split}_file {path!r}" for split, path in files.items())
        try:
            raw = load_dataset(kind, data_files=files, **extra)
        except Exception as error:  # a parse error deep inside `datasets`: name the file(s) and the cause
            cause = error.__cause__ or error.__context__ or error
            if "corresponds to no data" in str(cause):
                raise UsageError(f"{names}: no data rows.") from None
            raise UsageError(f"{names}: cannot be read as {kind}: {_first_line(cause)}") from None
        if "validation" not in raw:
            p = args.validation_split_percentage or 5
            try:
                raw["validation"] = load_dataset(kind, data_files=files, split=f"train[:{p}%]", **extra)
                raw["train"] = load_dataset(kind, data_files=files, split=f"train[{p}%:]", **extra)
            except Exception as error:
                if "corresponds to no data" not in str(error):
                    raise
                raise UsageError(f"--train_file {args.train_file!r} has {len(raw['train'])} rows: too few to hold "
                                 f"out --validation_split_percentage {p}%; pass a --validation_file, a larger "
                                 "percentage or more data.") from None
        return raw
    # Documents are separated by a blank line, as they would be in a text file.
    splits = embedded_splits((args.validation_split_percentage or 10) / 100)
    return DatasetDict({name: Dataset.from_dict({"text": [d + "\n\n" for d in docs]}) for name, docs in splits.items()})


def data_source(args: argparse.Namespace, split: str) -> str:
    """How the flags name a split's data, for error messages: ``--train_file 'a.csv'``, ``--dataset_name 'x'``..."""
    if args.train_file:
        if split == "validation" and args.validation_file:
            return f"--validation_file {args.validation_file!r}"
        held_out = "" if split == "train" else f" (the held-out {args.validation_split_percentage or 5}%)"
        return f"--train_file {args.train_file!r}{held_out}"
    if args.dataset_name:
        return f"--dataset_name {args.dataset_name!r} ({split} split)"
    return f"the {split} data"


def _is_text_feature(feature: Any) -> bool:
    return getattr(feature, "dtype", None) in ("string", "large_string")


def text_column_of(dataset: Dataset, requested: str | None, source: str = "the dataset") -> str:
    """``requested``, else ``"text"``, else the first column; it must hold text. Raises :class:`UsageError` naming
    ``source`` (the file or dataset), the column and the available columns with their types otherwise."""
    columns = dataset.column_names
    if not columns:
        raise UsageError(f"{source} has no columns.")

    def described() -> str:
        return ", ".join(f"{name} ({getattr(dataset.features[name], 'dtype', type(dataset.features[name]).__name__)})"
                         for name in columns)

    if requested:
        if requested not in columns:
            raise UsageError(f"{source}: --text_column {requested!r} is not a column; columns: {described()}.")
        column, how = requested, "--text_column"
    else:
        column = "text" if "text" in columns else columns[0]
        how = "the default text column" if column == "text" else "the first column, used as there is no 'text' column"
    if not _is_text_feature(dataset.features[column]):
        kind = getattr(dataset.features[column], "dtype", type(dataset.features[column]).__name__)
        raise UsageError(f"{source}: column {column!r} ({how}) holds {kind} values, not text; columns: "
                         f"{described()}; pick a text column with --text_column.")
    return column


def group_texts(examples: dict[str, list], block_size: int) -> dict[str, list]:
    """Concatenate the token lists of a batch of rows and cut them into ``block_size`` chunks (the remainder of the
    batch is dropped), as HF's run_clm/run_mlm do."""
    concatenated = {key: list(chain.from_iterable(values)) for key, values in examples.items()}
    total = len(concatenated["input_ids"]) // block_size * block_size
    return {key: [values[i: i + block_size] for i in range(0, total, block_size)]
            for key, values in concatenated.items()}


def get_tokenizer(args: argparse.Namespace, raw: DatasetDict, accelerator: Accelerator,
                  text_column: str) -> PreTrainedTokenizerBase:
    """The tokenizer: --tokenizer_name, the resumed checkpoint's, --model_name_or_path's, or a byte-level BPE trained
    on the training split (the main process trains it and saves it in --output_dir, the others load it)."""
    source = args.tokenizer_name or args.resume_path or args.model_name_or_path
    if args.tokenizer_name and Path(args.tokenizer_name).is_dir() and not any(
            (Path(args.tokenizer_name) / name).is_file() for name in TOKENIZER_FILES):
        raise UsageError(f"--tokenizer_name {args.tokenizer_name!r} is a folder without tokenizer files (none of "
                         f"{', '.join(TOKENIZER_FILES)}).")
    if source:
        try:
            return AutoTokenizer.from_pretrained(str(source), trust_remote_code=args.trust_remote_code)
        except (OSError, ValueError) as error:
            flag = ("--tokenizer_name" if args.tokenizer_name else
                    "--resume_from_checkpoint" if args.resume_path else "--model_name_or_path")
            raise UsageError(f"{flag} {str(source)!r}: {_hub_hint(str(source))}no tokenizer could be loaded "
                             f"({_first_line(error)}).") from None
    output_dir = Path(args.output_dir)
    with accelerator.main_process_first():
        if accelerator.is_main_process:
            texts = (text for text in raw["train"][text_column] if text)
            # A masked LM gets RoBERTa's template (<s> A </s></s> B </s>), so a later sentence-pair finetune (GLUE)
            # sees a separator between the two sentences; a causal LM keeps plain byte-level text.
            tokenizer = train_byte_level_bpe(texts, vocab_size=args.vocab_size, add_bos_eos=args.task == "mlm")
            output_dir.mkdir(parents=True, exist_ok=True)
            tokenizer.save_pretrained(output_dir)
        else:
            tokenizer = AutoTokenizer.from_pretrained(str(output_dir))
    return tokenizer


def tokenize_and_group(args: argparse.Namespace, raw: DatasetDict, tokenizer: PreTrainedTokenizerBase,
                       accelerator: Accelerator, text_column: str) -> tuple[DatasetDict, torch.Tensor | None]:
    """Blocks of ``--block_size`` tokens for both splits, and (with --eval_lengths) the validation split as one token
    stream. Raises :class:`UsageError` when a split is shorter than one block."""
    mlm = args.task == "mlm"

    def tokenize(examples: dict[str, list]) -> dict[str, list]:
        texts = [text if text is not None else "" for text in examples[text_column]]  # empty CSV cells are None
        return tokenizer(texts, return_special_tokens_mask=mlm, return_attention_mask=False)

    with accelerator.main_process_first():
        tokenized = DatasetDict({
            split: raw[split].map(tokenize, batched=True, num_proc=args.preprocessing_num_workers,
                                  remove_columns=raw[split].column_names, desc=f"tokenizing {split}")
            for split in ("train", "validation")
        })
        grouped = tokenized.map(partial(group_texts, block_size=args.block_size), batched=True,
                                num_proc=args.preprocessing_num_workers, desc=f"grouping into {args.block_size}")
    for split in ("train", "validation"):
        if len(grouped[split]) == 0:
            tokens = sum(len(ids) for ids in tokenized[split]["input_ids"])
            raise UsageError(f"--block_size {args.block_size} is larger than the {split} data ({tokens} tokens in "
                             f"{data_source(args, split)}): use a smaller --block_size or more data.")
    stream = None
    if args.eval_lengths_list:
        stream = torch.tensor(list(chain.from_iterable(tokenized["validation"]["input_ids"])), dtype=torch.long)
        if len(stream) < args.eval_lengths_list[-1]:
            raise UsageError(f"--eval_lengths {args.eval_lengths_list[-1]} is longer than the validation data "
                             f"({len(stream)} tokens).")
    if args.max_eval_samples:
        grouped["validation"] = grouped["validation"].select(range(min(args.max_eval_samples,
                                                                       len(grouped["validation"]))))
    grouped.set_format("torch")
    return grouped, stream


# ---------------------------------------------------------------------------------------------------------------
# Model
# ---------------------------------------------------------------------------------------------------------------
def resolve_config(args: argparse.Namespace):
    """The model config from --model_name_or_path, or --config_name (preset name, JSON file, folder) with
    --config_overrides. Raises :class:`UsageError` for a missing file, an unknown preset or an unknown field."""
    if args.model_name_or_path:  # a saved folder, or a Hub id for users online
        try:
            return AutoConfig.from_pretrained(args.model_name_or_path, trust_remote_code=args.trust_remote_code)
        except (OSError, ValueError) as error:
            raise UsageError(f"--model_name_or_path {args.model_name_or_path!r}: {_hub_hint(args.model_name_or_path)}"
                             f"{_first_line(error)}") from None
    name = args.config_name or DEFAULT_CONFIG
    overrides = parse_config_overrides(args.config_overrides)
    path = Path(name)
    looks_like_path = path.suffix == ".json" or os.sep in name or path.exists()
    if looks_like_path:
        if not path.exists():
            raise UsageError(f"--config_name {name!r} does not exist.")
        config_file = path / "config.json" if path.is_dir() else path
        if not config_file.is_file():
            raise UsageError(f"--config_name {name!r} is a folder without config.json.")
        try:
            model_type = json.loads(config_file.read_text()).get("model_type", "tnn")
        except json.JSONDecodeError as error:
            raise UsageError(f"--config_name {name!r} is not valid JSON: {error}.") from None
        if model_type != "tnn":  # any other transformers architecture (the quality benchmark's GPT-2)
            config = AutoConfig.from_pretrained(str(config_file), trust_remote_code=args.trust_remote_code)
            known = set(config.to_dict()) | set(getattr(config, "attribute_map", {}))
            unknown = sorted(set(overrides) - known)
            if unknown:
                raise UsageError(f"--config_overrides: unknown {type(config).__name__} field(s) {unknown}.")
            for key, value in overrides.items():
                setattr(config, key, value)
            return config
    elif name not in list_presets():
        raise UsageError(f"--config_name {name!r} is not a preset ({', '.join(list_presets())}), a JSON file or a "
                         "folder.")
    try:
        return load_preset(name, **overrides)
    except ValueError as error:
        raise UsageError(f"--config_name/--config_overrides: {error}") from None


def build_model(args: argparse.Namespace, config, tokenizer: PreTrainedTokenizerBase) -> torch.nn.Module:
    """A new model from ``config`` sized to the tokenizer, or the --model_name_or_path model."""
    auto = AutoModelForCausalLM if args.task == "clm" else AutoModelForMaskedLM
    if args.model_name_or_path:
        model = auto.from_pretrained(args.model_name_or_path, config=config, trust_remote_code=args.trust_remote_code)
        if len(tokenizer) > model.get_input_embeddings().weight.shape[0]:
            model.resize_token_embeddings(len(tokenizer))
        return model
    if "vocab_size" in parse_config_overrides(args.config_overrides):
        if config.vocab_size < len(tokenizer):
            raise UsageError(f"--config_overrides vocab_size={config.vocab_size} is smaller than the tokenizer "
                             f"({len(tokenizer)} tokens).")
    else:
        config.vocab_size = len(tokenizer)
    for name in ("pad_token_id", "bos_token_id", "eos_token_id"):
        if getattr(tokenizer, name, None) is not None:
            setattr(config, name, getattr(tokenizer, name))
    if args.task == "mlm" and tokenizer.mask_token is None:
        raise UsageError("train_mlm needs a tokenizer with a mask token; --tokenizer_name has none.")
    try:
        return auto.from_config(config, trust_remote_code=args.trust_remote_code)
    except ValueError as error:  # e.g. causal=false for a causal LM: name the flags that set it
        raise UsageError(f"--config_name/--config_overrides: {error}") from None


def optimizer_groups(model: torch.nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    """AdamW groups: weight decay on matrices only (not on biases and norm weights, as HF's scripts)."""
    decay = [p for p in model.parameters() if p.requires_grad and p.ndim >= 2]
    no_decay = [p for p in model.parameters() if p.requires_grad and p.ndim < 2]
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


# ---------------------------------------------------------------------------------------------------------------
# Evaluation
# ---------------------------------------------------------------------------------------------------------------
def perplexity(loss: float) -> float:
    """``exp(loss)``, ``inf`` on overflow."""
    try:
        return math.exp(loss)
    except OverflowError:
        return float("inf")


def token_loss_sums(logits: torch.Tensor, labels: torch.Tensor, shift: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row sums of the token cross-entropy and the number of scored tokens (labels != -100); ``shift`` scores
    token t+1 from position t (causal LM)."""
    if shift:
        logits, labels = logits[:, :-1], labels[:, 1:]
    losses = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), labels.reshape(-1), ignore_index=-100,
                             reduction="none").view(labels.shape)
    scored = labels != -100
    return (losses * scored).sum(dim=1), scored.sum(dim=1)


class InputBuilder:
    """Turns a batch of token blocks into model inputs: causal LM labels are the inputs (the model shifts them);
    masked LM inputs go through ``DataCollatorForLanguageModeling`` here, in the training step rather than in the
    DataLoader, so its random masks come from the global RNG in step order (Accelerate's DataLoader reads one batch
    ahead, which would make a resumed run mask differently)."""

    def __init__(self, task: str, tokenizer: PreTrainedTokenizerBase, mlm_probability: float | None):
        self.task = task
        self.collator = (DataCollatorForLanguageModeling(tokenizer, mlm=True, mlm_probability=mlm_probability)
                         if task == "mlm" else None)

    def __call__(self, batch: dict[str, torch.Tensor]) -> dict[str, Any]:
        ids = batch["input_ids"]
        if self.collator is None:  # a causal LM: no generation cache when scoring whole blocks
            return {"input_ids": ids, "labels": ids, "use_cache": False}
        rows = [{"input_ids": row.cpu(), "special_tokens_mask": mask.cpu()}
                for row, mask in zip(ids, batch["special_tokens_mask"])]
        masked = self.collator(rows)
        return {"input_ids": masked["input_ids"].to(ids.device), "labels": masked["labels"].to(ids.device)}


@torch.no_grad()
def evaluate(model: torch.nn.Module, dataloader: DataLoader, accelerator: Accelerator, build_inputs: InputBuilder,
             seed: int) -> dict[str, float]:
    """Token-weighted validation loss and perplexity over all processes. Masked-LM masks are drawn from a forked RNG
    seeded with ``seed``: the same masks at every evaluation, and the training RNG is left untouched."""
    model.eval()
    sums, counts = [], []
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        for batch in dataloader:
            inputs = build_inputs(batch)
            labels = inputs.pop("labels")
            logits = model(**inputs).logits
            row_sums, row_counts = token_loss_sums(logits, labels, shift=build_inputs.task == "clm")
            row_sums, row_counts = accelerator.gather_for_metrics((row_sums, row_counts))
            sums.append(row_sums.double().cpu())
            counts.append(row_counts.cpu())
    model.train()
    loss = (torch.cat(sums).sum() / torch.cat(counts).sum().clamp(min=1)).item()
    return {"eval_loss": loss, "perplexity": perplexity(loss)}


def position_limit(model: torch.nn.Module) -> int | None:
    """The longest input a model's position table allows (``None`` for TNN, which has none)."""
    return getattr(model.config, "max_position_embeddings", None)


@torch.no_grad()
def evaluate_lengths(model: torch.nn.Module, stream: torch.Tensor, lengths: Iterable[int], *, window: int | None = None,
                     batch_size: int = 4, build_inputs: InputBuilder | None = None, seed: int = 0,
                     max_tokens: int | None = None) -> dict[int, dict[str, Any]]:
    """Validation loss/perplexity at each evaluation length L.

    The token ``stream`` is cut to a multiple of the longest L (and at most ``max_tokens`` rounded up to one), so
    every L scores the same text, then split into segments of L tokens. ``window=None`` reads each segment whole
    (a "full window"); otherwise a sliding window of ``window`` tokens with stride ``window // 2`` scores each
    token once, conditioned on up to ``window - 1`` earlier tokens of its segment (the standard way to evaluate a
    model whose position table is shorter than L). A causal model is scored on next-token prediction; with a masked-LM
    ``build_inputs`` each segment is masked with a fixed seed (full windows only).
    """
    lengths = sorted(set(lengths))
    longest = lengths[-1]
    usable = len(stream) // longest * longest
    if max_tokens:
        usable = min(usable, max(longest, math.ceil(max_tokens / longest) * longest))
    if usable == 0:
        raise ValueError(f"The evaluation stream ({len(stream)} tokens) is shorter than the longest length {longest}.")
    masked = build_inputs is not None and build_inputs.task == "mlm"
    if masked and window is not None:
        raise ValueError("Sliding-window evaluation is for causal models only.")
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    results: dict[int, dict[str, Any]] = {}
    for length in lengths:
        segments = stream[:usable].view(-1, length)
        total, count = torch.zeros((), dtype=torch.float64), 0
        sliding = window is not None and window < length
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            for rows in segments.split(batch_size):
                rows = rows.to(device)
                if masked:
                    inputs = build_inputs({"input_ids": rows, "special_tokens_mask": torch.zeros_like(rows)})
                    row_sums, row_counts = token_loss_sums(model(input_ids=inputs["input_ids"]).logits,
                                                           inputs["labels"], shift=False)
                    total += row_sums.double().sum().cpu()
                    count += int(row_counts.sum())
                    continue
                for start, end, first in _windows(length, window if sliding else length):
                    labels = rows[:, start:end].clone()
                    labels[:, : first - start] = -100  # tokens an earlier window already scored
                    logits = model(input_ids=rows[:, start:end], use_cache=False).logits
                    row_sums, row_counts = token_loss_sums(logits, labels, shift=True)
                    total += row_sums.double().sum().cpu()
                    count += int(row_counts.sum())
        loss = (total / max(count, 1)).item()
        results[length] = {"loss": loss, "perplexity": perplexity(loss), "tokens": count,
                           "mode": f"sliding window {window}, stride {max(1, window // 2)}" if sliding else "full"}
    model.train(was_training)
    return results


def _windows(length: int, window: int) -> Iterator[tuple[int, int, int]]:
    """``(start, end, first_scored_input_position)`` of the windows covering one segment; the labels of positions
    below ``first`` are ignored (with the causal shift, the token at ``first`` is the first one not scored yet)."""
    stride = max(1, window // 2)
    start, scored_upto = 0, 0  # scored_upto: every target position < scored_upto has been scored
    while True:
        end = min(start + window, length)
        yield start, end, max(start, scored_upto)
        scored_upto = end
        if end == length:
            return
        start += stride


def plot_lengths(curves: dict[str, dict[int, float]], path: str | Path, train_length: int | None = None,
                 title: str = "Validation perplexity vs evaluation length") -> None:
    """Plot ``{label: {length: perplexity}}`` on a log2 length axis and save a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for label, points in curves.items():
        xs = sorted(points)
        ax.plot(xs, [points[x] for x in xs], marker="o", label=label)
    if train_length:
        ax.axvline(train_length, color="grey", linestyle=":", label="training length")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("evaluation length (tokens)")
    ax.set_ylabel("validation perplexity")
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


@torch.no_grad()
def generate_sample(model: torch.nn.Module, tokenizer: PreTrainedTokenizerBase, prompt: str, max_new_tokens: int,
                    seed: int) -> str:
    """A sampled continuation of ``prompt`` (top-k 40, temperature 0.8), reproducible through ``seed``."""
    device = next(model.parameters()).device
    encoded = tokenizer(prompt, return_tensors="pt").to(device)
    was_training = model.training
    model.eval()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        out = model.generate(**encoded, max_new_tokens=max_new_tokens, do_sample=True, top_k=40, temperature=0.8,
                             pad_token_id=tokenizer.pad_token_id)
    model.train(was_training)
    return tokenizer.decode(out[0], skip_special_tokens=True)


@torch.no_grad()
def time_generation(model: torch.nn.Module, contexts: Sequence[int], new_tokens: int = 8,
                    seed: int = 0) -> list[dict[str, float]]:
    """Per-token generation time (milliseconds, median over ``new_tokens`` greedy tokens) after a context of each
    length, with the model's cache and with a full recompute, through the public API only:

    * cached: ``out = model(input_ids=context, use_cache=True)``, then ``model(input_ids=next_token,
      cache=out.cache)`` per token (``past_key_values=`` on transformers 5.23);
    * no cache: ``model(input_ids=sequence_so_far, use_cache=False)`` per token, the sequence growing by one.

    The contexts are random token ids (the time does not depend on the text). The measurements are interleaved
    (each round times one token of every kind at every length), so that a burst of load on a shared machine spreads
    over all of them, after one untimed round. Returns ``[{"context": n, "cached_ms": ..., "no_cache_ms": ...,
    "speedup": ...}, ...]``."""
    from modeling_tnn.modeling_tnn import CACHE_FIELD  # "cache" on transformers 5.24, "past_key_values" on 5.23

    device = next(model.parameters()).device
    vocab = model.get_input_embeddings().weight.shape[0]
    was_training = model.training
    model.eval()
    generator = torch.Generator().manual_seed(seed)
    state = {}
    for length in contexts:
        ids = torch.randint(0, vocab, (1, length), generator=generator).to(device)
        out = model(input_ids=ids, use_cache=True)
        state[length] = {"cache": getattr(out, CACHE_FIELD), "token": out.logits[:, -1:].argmax(-1),
                         "sequence": ids, "cached": [], "full": []}
    for round_index in range(new_tokens + 1):  # round 0 is a warm-up
        for length in contexts:
            entry = state[length]
            start = time.perf_counter()
            out = model(input_ids=entry["token"], use_cache=True, **{CACHE_FIELD: entry["cache"]})
            entry["token"] = out.logits[:, -1:].argmax(-1)
            elapsed = time.perf_counter() - start
            entry["cache"] = getattr(out, CACHE_FIELD)
            if round_index:
                entry["cached"].append(elapsed)
            start = time.perf_counter()
            logits = model(input_ids=entry["sequence"], use_cache=False).logits
            entry["sequence"] = torch.cat([entry["sequence"], logits[:, -1:].argmax(-1)], dim=1)
            if round_index:
                entry["full"].append(time.perf_counter() - start)
    model.train(was_training)
    rows = []
    for length in contexts:
        cached_ms = 1e3 * statistics.median(state[length]["cached"])
        full_ms = 1e3 * statistics.median(state[length]["full"])
        rows.append({"context": length, "cached_ms": cached_ms, "no_cache_ms": full_ms,
                     "speedup": full_ms / max(cached_ms, 1e-9)})
    return rows


def format_generation_table(rows: list[dict[str, float]]) -> str:
    """The :func:`time_generation` rows as a Markdown table."""
    lines = ["| context | ms/token with cache | ms/token without cache (full recompute) | ratio |",
             "|---|---|---|---|"]
    lines += [f"| {r['context']} | {r['cached_ms']:.1f} | {r['no_cache_ms']:.1f} | {r['speedup']:.1f}x |"
              for r in rows]
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------------------------
# Logging and publishing
# ---------------------------------------------------------------------------------------------------------------
class MetricsLog:
    """Appends one JSON object per line to ``output_dir/metrics.jsonl`` (main process) and forwards the values to
    Accelerate's trackers (TensorBoard, ...) when any is active."""

    def __init__(self, accelerator: Accelerator, output_dir: Path, trackers: bool):
        self.accelerator, self.path, self.trackers = accelerator, output_dir / METRICS_FILE, trackers

    def log(self, values: dict[str, Any], step: int) -> None:
        if self.accelerator.is_main_process:
            with open(self.path, "a") as handle:
                handle.write(json.dumps({"step": step, **values}) + "\n")
        if self.trackers:
            self.accelerator.log({k: v for k, v in values.items() if isinstance(v, (int, float))}, step=step)


class TiedWeightSaveFilter(logging.Filter):
    """Drops the warning Accelerate logs at every ``save_state`` of a model with tied embeddings, ``Removed shared
    tensor {'lm_head.weight'} while saving. ...``, when every name it lists is a tied weight registered in
    :attr:`names` (``from_pretrained`` and ``load_state`` re-tie those). Any other shared tensor still warns."""

    PATTERN = re.compile(r"Removed shared tensor \{(.*)\} while saving")

    def __init__(self) -> None:
        super().__init__()
        self.names: set[str] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        match = self.PATTERN.search(record.getMessage())
        if match is None:
            return True
        listed = set(re.findall(r"'([^']*)'", match.group(1)))
        return not (listed and listed <= self.names)


TIED_WEIGHT_FILTER = TiedWeightSaveFilter()


def silence_tied_weight_warning(model: torch.nn.Module | None = None) -> None:
    """Install :data:`TIED_WEIGHT_FILTER` on Accelerate's logger (once) and register ``model``'s tied weights
    (the keys of its ``_tied_weights_keys``, e.g. ``lm_head.weight``)."""
    target = logging.getLogger("accelerate.utils.other")  # where clean_state_dict_for_safetensors logs
    if TIED_WEIGHT_FILTER not in target.filters:
        target.addFilter(TIED_WEIGHT_FILTER)
    tied = getattr(model, "_tied_weights_keys", None) if model is not None else None
    if isinstance(tied, dict):
        TIED_WEIGHT_FILTER.names.update(tied)
    elif isinstance(tied, (list, tuple, set)):
        TIED_WEIGHT_FILTER.names.update(tied)


def available_trackers(report_to: str) -> list[str]:
    """The trackers of ``--report_to`` whose packages are installed (missing ones are skipped with a warning)."""
    if report_to in ("none", ""):
        return []
    from accelerate.tracking import LOGGER_TYPE_TO_CLASS

    wanted = list(LOGGER_TYPE_TO_CLASS) if report_to == "all" else [x.strip() for x in report_to.split(",")]
    found = []
    for name in wanted:
        tracker = LOGGER_TYPE_TO_CLASS.get(name)
        if tracker is None:
            raise UsageError(f"--report_to {name!r} is not a tracker; use one of {sorted(LOGGER_TYPE_TO_CLASS)}, "
                             "'all' or 'none'.")
        if _tracker_installed(name):
            found.append(name)
        elif report_to != "all":
            logger.info("--report_to %s: the package is not installed, logging to %s only.", name, METRICS_FILE)
    return found


def _tracker_installed(name: str) -> bool:
    import accelerate.utils as utils

    check = getattr(utils, f"is_{name}_available", None)
    return bool(check and check())


def hub_repo_id(args: argparse.Namespace) -> str:
    """--hub_model_id, else the output folder's name (HF's convention)."""
    return args.hub_model_id or Path(args.output_dir).resolve().name


def check_push_to_hub(args: argparse.Namespace) -> None:
    """Before training: a valid repository id and a Hub token, so a long run does not end in a failed upload."""
    import hub_publishing

    try:
        hub_publishing.validate_repo_id(hub_repo_id(args))
        hub_publishing.require_token()
    except hub_publishing.PublishError as error:
        raise UsageError(f"--push_to_hub: {error}".replace("--repo_id", "--hub_model_id")) from None


def push_to_hub(args: argparse.Namespace, output_dir: Path, commit_message: str) -> str:
    """Publish the finished run with the project's publishing code (``hub_publishing.publish_run``, what
    ``publish.py`` runs): an allow-listed Hub folder with a model card, built in a temporary folder, then one upload
    (checkpoints, optimizer states and logs never leave the machine). Returns the commit URL."""
    import tempfile

    import hub_publishing

    if args.dataset_name:
        data = hub_publishing.DatasetRef(hub_id=args.dataset_name, name=args.dataset_name,
                                         config=args.dataset_config_name, split="validation")
    else:
        name = Path(args.train_file).name if args.train_file else "CPython pydoc topics (embedded corpus)"
        data = hub_publishing.DatasetRef(name=name, split="validation")
    with tempfile.TemporaryDirectory() as tmp:
        _, commit = hub_publishing.publish_run(output_dir, hub_repo_id(args), Path(tmp) / "hub",
                                               options=hub_publishing.CardOptions(dataset=data),
                                               commit_message=commit_message)
    return str(getattr(commit, "commit_url", commit))


# ---------------------------------------------------------------------------------------------------------------
# The run
# ---------------------------------------------------------------------------------------------------------------
@dataclass
class Session:
    """Everything :func:`setup` prepared for :func:`train`."""

    args: argparse.Namespace
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
    max_train_steps: int
    steps_per_epoch: int
    num_train_epochs: int
    train_blocks: int
    completed_steps: int = 0
    tokens_seen: int = 0
    fingerprint: dict[str, Any] = field(default_factory=dict)  # model config and tokenizer, see run_fingerprint


@dataclass
class RunOutcome:
    """What :func:`run` returns: ``results`` (as written to all_results.json), the trained (unwrapped) model, the
    tokenizer, and the validation token stream when --eval_lengths was given."""

    results: dict[str, Any]
    model: torch.nn.Module
    tokenizer: PreTrainedTokenizerBase
    eval_stream: torch.Tensor | None = None
    samples: list[str] = field(default_factory=list)


def _reset_single_process_state() -> None:
    # Accelerate keeps process-wide singletons; tests and the benchmark run several trainings in one process.
    if int(os.environ.get("WORLD_SIZE", "1")) == 1:
        from accelerate.state import AcceleratorState, GradientState

        AcceleratorState._reset_state(reset_partial_state=True)
        GradientState._reset_state()


def setup(args: argparse.Namespace, task: str, raw_datasets: DatasetDict | None = None) -> Session:
    """Validate the flags, load data, build tokenizer, model, optimizer and schedule, restore a checkpoint. Every
    input error raises ``ValueError`` (:class:`UsageError`) here, before any training step."""
    args.task = task
    check_args(args)
    config = resolve_config(args)
    trackers = available_trackers(args.report_to)
    _reset_single_process_state()
    # Several processes and no accelerator device: without cpu=True Accelerate would run them as independent jobs.
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    has_device = torch.accelerator.is_available() if hasattr(torch, "accelerator") else torch.cuda.is_available()
    accelerator = Accelerator(cpu=world_size > 1 and not has_device,
                              gradient_accumulation_steps=args.gradient_accumulation_steps,
                              mixed_precision=args.mixed_precision, log_with=trackers or None,
                              project_dir=args.output_dir)
    # Our own progress lines at INFO on the main process; other libraries' chatter only from WARNING up.
    logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s", level=logging.WARNING)
    logger.setLevel(logging.INFO if accelerator.is_main_process else logging.ERROR)
    set_seed(args.seed, device_specific=True)  # dropout differs across processes; DDP broadcasts rank 0's init
    silence_tied_weight_warning()
    output_dir = Path(args.output_dir)
    if accelerator.is_main_process:
        if args.overwrite_output_dir and not args.resume_path:
            deleted = clear_previous_run(output_dir)
            if deleted:
                logger.info("--overwrite_output_dir: deleted %s from %s", _name_list(deleted, 8), output_dir)
        output_dir.mkdir(parents=True, exist_ok=True)
        if not args.resume_path:  # a new run starts a new log; a resumed one appends
            (output_dir / METRICS_FILE).unlink(missing_ok=True)
    accelerator.wait_for_everyone()

    with accelerator.main_process_first():
        raw = raw_datasets if raw_datasets is not None else load_raw_datasets(args)
    for split in ("train", "validation"):
        if split not in raw:
            raise UsageError(f"The dataset has no {split!r} split (splits: {list(raw)}).")
    for split in ("train", "validation"):
        if len(raw[split]) == 0:
            raise UsageError(f"{data_source(args, split)} has no rows.")
    text_column = text_column_of(raw["train"], args.text_column, data_source(args, "train"))
    if text_column not in raw["validation"].column_names or not _is_text_feature(
            raw["validation"].features[text_column]):
        text_column_of(raw["validation"], text_column, data_source(args, "validation"))  # raises, naming the file
    tokenizer = get_tokenizer(args, raw, accelerator, text_column)
    data, stream = tokenize_and_group(args, raw, tokenizer, accelerator, text_column)
    model = build_model(args, config, tokenizer)
    silence_tied_weight_warning(model)
    limit = position_limit(model)
    if limit is not None and args.block_size > limit:
        raise UsageError(f"--block_size {args.block_size} exceeds the model's position table ({limit}).")
    if accelerator.is_main_process:
        logger.info("%s: %.2fM parameters, %d training blocks of %d tokens, %d validation blocks",
                    type(model).__name__, model.num_parameters() / 1e6, len(data["train"]), args.block_size,
                    len(data["validation"]))

    # Each DataLoader iterator draws a base seed from its generator, by default the global RNG: a private generator
    # keeps the iterator a resumed run creates mid-epoch from shifting the dropout/masking RNG.
    train_dataloader = DataLoader(data["train"], sampler=EpochShuffleSampler(len(data["train"]), args.seed),
                                  batch_size=args.per_device_train_batch_size, collate_fn=default_data_collator,
                                  generator=torch.Generator().manual_seed(args.seed))
    eval_dataloader = DataLoader(data["validation"], batch_size=args.per_device_eval_batch_size,
                                 collate_fn=default_data_collator, generator=torch.Generator().manual_seed(args.seed))
    optimizer = torch.optim.AdamW(optimizer_groups(model, args.weight_decay), lr=args.learning_rate)
    model, optimizer, train_dataloader, eval_dataloader = accelerator.prepare(
        model, optimizer, train_dataloader, eval_dataloader)
    steps_per_epoch = math.ceil(len(train_dataloader) / args.gradient_accumulation_steps)
    max_train_steps = args.max_train_steps or args.num_train_epochs * steps_per_epoch
    num_train_epochs = math.ceil(max_train_steps / steps_per_epoch)
    # Accelerate's prepared scheduler steps once per process at each optimizer step (HF's scripts scale likewise).
    scheduler = get_scheduler(args.lr_scheduler_type, optimizer=optimizer,
                              num_warmup_steps=args.num_warmup_steps * accelerator.num_processes,
                              num_training_steps=max_train_steps * accelerator.num_processes)
    scheduler = accelerator.prepare(scheduler)
    if trackers:
        hparams = {k: v for k, v in vars(args).items() if isinstance(v, (int, float, str, bool))}
        accelerator.init_trackers(f"train_{task}", config=hparams)

    session = Session(args=args, accelerator=accelerator, model=model, tokenizer=tokenizer, optimizer=optimizer,
                      scheduler=scheduler, train_dataloader=train_dataloader, eval_dataloader=eval_dataloader,
                      build_inputs=InputBuilder(task, tokenizer, getattr(args, "mlm_probability", None)),
                      metrics=MetricsLog(accelerator, output_dir, bool(trackers)), eval_stream=stream,
                      max_train_steps=max_train_steps, steps_per_epoch=steps_per_epoch,
                      num_train_epochs=num_train_epochs, train_blocks=len(data["train"]),
                      fingerprint={"model_config": model_fingerprint(accelerator.unwrap_model(model)),
                                   "tokenizer": tokenizer_fingerprint(tokenizer)})
    if args.resume_path:
        _restore(session, Path(args.resume_path))
    return session


def _geometry(session: Session) -> dict[str, int]:
    args = session.args
    return {"train_blocks": session.train_blocks, "block_size": args.block_size,
            "per_device_train_batch_size": args.per_device_train_batch_size,
            "gradient_accumulation_steps": args.gradient_accumulation_steps,
            "num_processes": session.accelerator.num_processes, "seed": args.seed}


def _restore(session: Session, path: Path) -> None:
    """Check that the checkpoint belongs to this run (model config, tokenizer, data geometry), then load it.
    Raises :class:`UsageError` naming every differing field, before anything is loaded."""
    state = json.loads((path / TRAINER_STATE).read_text())
    differences = checkpoint_differences(state, {**session.fingerprint, "geometry": _geometry(session)})
    if differences:
        raise UsageError(f"--resume_from_checkpoint {str(path)!r} was written by another run (checkpoint -> this "
                         f"run): {'; '.join(differences)}. Resume with that run's flags, or start a new run with "
                         "--overwrite_output_dir or another --output_dir.")
    if "model_config" not in state:
        logger.warning("%s predates the model config and tokenizer records: only its data geometry was checked.",
                       path)
    session.accelerator.load_state(str(path))
    session.completed_steps = state["completed_steps"]
    session.tokens_seen = state.get("tokens_seen", 0)
    logger.info("Resumed from %s at step %d.", path, session.completed_steps)


def _checkpoint(session: Session, name: str, epoch: int) -> Path:
    state = {"completed_steps": session.completed_steps, "epoch": epoch, "steps_per_epoch": session.steps_per_epoch,
             "tokens_seen": session.tokens_seen, "geometry": _geometry(session), **session.fingerprint}
    output_dir = Path(session.args.output_dir)
    path = save_checkpoint(session.accelerator, output_dir, name, state, session.tokenizer)
    if session.accelerator.is_main_process:
        logger.info("Saved checkpoint %s", path)
        if session.args.checkpoints_total_limit:
            for old in rotate_checkpoints(output_dir, session.args.checkpoints_total_limit):
                logger.info("Deleted checkpoint %s (--checkpoints_total_limit %d)", old,
                            session.args.checkpoints_total_limit)
    session.accelerator.wait_for_everyone()
    return path


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


def train(session: Session) -> RunOutcome:
    """The training loop, periodic evaluation and checkpoints, then the final save, all_results.json, the length
    evaluation and the optional samples and Hub upload."""
    args, accelerator, model = session.args, session.accelerator, session.model
    output_dir = Path(args.output_dir)
    checkpoint_every = int(args.checkpointing_steps) if (args.checkpointing_steps or "").isdigit() else None
    start_step = session.completed_steps
    starting_epoch = start_step // session.steps_per_epoch
    skip_batches = (start_step % session.steps_per_epoch) * args.gradient_accumulation_steps
    progress = tqdm(total=session.max_train_steps, initial=start_step, desc=f"train_{args.task}",
                    disable=not accelerator.is_local_main_process, dynamic_ncols=True)

    def say(line: str) -> None:  # one copy of each message, above the progress bar
        if accelerator.is_local_main_process:
            progress.write(line)
    eval_metrics: dict[str, float] | None = None
    window_loss, window_batches, run_loss, run_batches = 0.0, 0, 0.0, 0
    start_time, start_tokens = time.time(), session.tokens_seen
    last_eval_step, epoch_finished = -1, False
    model.train()
    with StopOnSignal(say) as stopper:
        epoch = starting_epoch
        # A checkpoint of the last step (an interrupt at the end) resumes straight to the final evaluation and save.
        first_epoch = starting_epoch if start_step < session.max_train_steps else session.num_train_epochs
        for epoch in range(first_epoch, session.num_train_epochs):
            session.train_dataloader.set_epoch(epoch)
            loader = session.train_dataloader
            if epoch == starting_epoch and skip_batches:
                loader = accelerator.skip_first_batches(session.train_dataloader, skip_batches)
                loader.set_epoch(epoch)
            for batch in loader:
                with accelerator.accumulate(model):
                    loss = model(**session.build_inputs(batch)).loss
                    accelerator.backward(loss)
                    if accelerator.sync_gradients and args.max_grad_norm > 0:
                        accelerator.clip_grad_norm_(model.parameters(), args.max_grad_norm)
                    session.optimizer.step()
                    session.scheduler.step()
                    session.optimizer.zero_grad()
                value = loss.detach().float().item()
                window_loss, window_batches = window_loss + value, window_batches + 1
                run_loss, run_batches = run_loss + value, run_batches + 1
                session.tokens_seen += batch["input_ids"].numel() * accelerator.num_processes
                if not accelerator.sync_gradients:
                    continue
                session.completed_steps += 1
                step = session.completed_steps
                tokens_per_second = (session.tokens_seen - start_tokens) / max(time.time() - start_time, 1e-9)
                progress.update(1)
                progress.set_postfix(loss=f"{value:.3f}", tok_s=f"{tokens_per_second:.0f}")
                if step % args.logging_steps == 0 or step == session.max_train_steps:
                    session.metrics.log({"epoch": epoch, "train_loss": window_loss / window_batches,
                                         "learning_rate": session.scheduler.get_last_lr()[0],
                                         "tokens_per_second": tokens_per_second,
                                         "tokens_seen": session.tokens_seen}, step)
                    window_loss, window_batches = 0.0, 0
                if args.eval_steps and step % args.eval_steps == 0:
                    eval_metrics = evaluate(model, session.eval_dataloader, accelerator, session.build_inputs,
                                            args.seed)
                    session.metrics.log({"epoch": epoch, **eval_metrics}, step)
                    say(f"step {step}: eval_loss {eval_metrics['eval_loss']:.4f}, "
                        f"perplexity {eval_metrics['perplexity']:.2f}")
                    last_eval_step = step
                saved = None
                if checkpoint_every and step % checkpoint_every == 0:
                    saved = _checkpoint(session, f"step_{step}", epoch)
                stop_signal = stopper.requested(accelerator)
                if stop_signal:  # SIGINT/SIGTERM: a checkpoint of this step, then stop
                    saved = saved or _checkpoint(session, f"step_{step}", epoch)
                    progress.close()
                    accelerator.end_training()
                    raise TrainingInterrupted(stop_signal, step, saved)
                if step >= session.max_train_steps:
                    break
            else:  # the epoch ran to its end
                epoch_finished = True
            if not epoch_finished:
                break
            epoch_finished = False
            if args.eval_steps is None and session.completed_steps != last_eval_step:
                eval_metrics = evaluate(model, session.eval_dataloader, accelerator, session.build_inputs, args.seed)
                session.metrics.log({"epoch": epoch, **eval_metrics}, session.completed_steps)
                say(f"epoch {epoch}: eval_loss {eval_metrics['eval_loss']:.4f}, "
                    f"perplexity {eval_metrics['perplexity']:.2f}")
                last_eval_step = session.completed_steps
            if args.checkpointing_steps == "epoch":
                _checkpoint(session, f"epoch_{epoch}", epoch)
            if session.completed_steps >= session.max_train_steps:
                break
    progress.close()
    runtime = time.time() - start_time
    if last_eval_step != session.completed_steps or eval_metrics is None:
        eval_metrics = evaluate(model, session.eval_dataloader, accelerator, session.build_inputs, args.seed)
        session.metrics.log({"epoch": epoch, **eval_metrics}, session.completed_steps)

    accelerator.wait_for_everyone()
    unwrapped = accelerator.unwrap_model(model)
    unwrapped.save_pretrained(output_dir, is_main_process=accelerator.is_main_process, save_function=accelerator.save)
    if accelerator.is_main_process:
        session.tokenizer.save_pretrained(output_dir)

    results: dict[str, Any] = {
        **eval_metrics,
        "train_loss": run_loss / max(run_batches, 1),
        "train_runtime": runtime,
        "train_steps": session.completed_steps,
        "train_tokens": session.tokens_seen,
        "train_tokens_per_second": (session.tokens_seen - start_tokens) / max(runtime, 1e-9),
        "epoch": epoch,
        "num_parameters": unwrapped.num_parameters(),
        "num_processes": accelerator.num_processes,
        "block_size": args.block_size,
    }
    outcome = RunOutcome(results=results, model=unwrapped, tokenizer=session.tokenizer,
                         eval_stream=session.eval_stream)
    if accelerator.is_main_process:
        print(f"eval_loss {eval_metrics['eval_loss']:.4f}  validation perplexity {eval_metrics['perplexity']:.2f}")
        if args.eval_lengths_list:
            _length_evaluation(session, unwrapped, results, output_dir)
        for prompt in getattr(args, "sample_prompt", None) or []:
            text = generate_sample(unwrapped, session.tokenizer, prompt, args.sample_max_new_tokens, args.seed)
            outcome.samples.append(text)
            print(f"--- sample ---\n{text}\n")
        if args.time_generation_list:
            rows = time_generation(unwrapped, args.time_generation_list, seed=args.seed)
            results["generation_ms_per_token"] = rows
            print("Per-token generation time against the context length (batch 1, greedy, median of 8 tokens):")
            print(format_generation_table(rows))
        (output_dir / RESULTS_FILE).write_text(json.dumps(results, indent=2))
        if args.push_to_hub:
            url = push_to_hub(args, output_dir, f"train_{args.task}: step {session.completed_steps}")
            print(f"pushed to {url}")
    accelerator.wait_for_everyone()
    accelerator.end_training()
    return outcome


def _length_evaluation(session: Session, model: torch.nn.Module, results: dict[str, Any], output_dir: Path) -> None:
    args = session.args
    limit = position_limit(model)
    window = limit if limit is not None and limit < args.eval_lengths_list[-1] else None
    by_length = evaluate_lengths(model, session.eval_stream, args.eval_lengths_list, window=window,
                                 batch_size=args.per_device_eval_batch_size, build_inputs=session.build_inputs,
                                 seed=args.seed)
    results["eval_lengths"] = {str(length): values for length, values in by_length.items()}
    print("| eval length | perplexity | scored tokens | mode |\n|---|---|---|---|")
    for length, values in by_length.items():
        print(f"| {length} | {values['perplexity']:.2f} | {values['tokens']} | {values['mode']} |")
    plot_lengths({type(model).__name__: {length: v["perplexity"] for length, v in by_length.items()}},
                 output_dir / "eval_lengths.png", train_length=args.block_size)


def run(args: argparse.Namespace, task: str, raw_datasets: DatasetDict | None = None) -> RunOutcome:
    """Set up and train (see :func:`setup` and :func:`train`). ``raw_datasets`` replaces the data flags with
    in-memory ``train``/``validation`` splits."""
    return train(setup(args, task, raw_datasets))


def cli_main(task: str, argv: list[str] | None = None) -> None:
    """Entry point of the scripts: an input error prints ``error: ...`` and exits with status 2 before training."""
    args = parse_args(task, argv)
    script = Path(sys.argv[0]).name
    try:
        session = setup(args, task)
    except (UsageError, FileNotFoundError) as error:
        print(f"{script}: error: {error}", file=sys.stderr)
        raise SystemExit(2) from None
    except KeyboardInterrupt:
        print(f"{script}: interrupted before training started; nothing to save.", file=sys.stderr)
        raise SystemExit(EXIT_CODES["SIGINT"]) from None
    try:
        train(session)
    except TrainingInterrupted as stop:
        print(f"{script}: stopped by {stop.signal_name} at step {stop.step}; saved checkpoint {stop.checkpoint}; "
              f"resume with --resume_from_checkpoint {stop.checkpoint}", file=sys.stderr)
        raise SystemExit(stop.exit_code) from None
    except KeyboardInterrupt:
        latest = find_latest_checkpoint(args.output_dir)
        where = (f"; the newest checkpoint is {latest}: resume with --resume_from_checkpoint {latest}" if latest
                 else "; no checkpoint was written")
        print(f"{script}: interrupted{where}", file=sys.stderr)
        raise SystemExit(EXIT_CODES["SIGINT"]) from None
