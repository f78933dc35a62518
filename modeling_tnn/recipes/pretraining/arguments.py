"""The command line of ``train_clm.py`` and ``train_mlm.py`` (the flags of Hugging Face's ``run_clm_no_trainer.py`` /
``run_mlm_no_trainer.py``) and its validation before training."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from transformers import (
    SchedulerType,
)

from modeling_tnn import list_presets

from ..common.flag_checks import UsageError, check_local_path, name_list
from ..common.run_files import METRICS_FILE, RESULTS_FILE
from ..hub.folder import require_token, validate_repo_id
from ..hub.run_inspection import PublishError
from .checkpoints import is_valid_checkpoint, resolve_checkpoint, run_files_in
from .data import data_file_type

TASKS = ("clm", "mlm")
DEFAULT_CONFIG = "small"


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
    train.add_argument("--torch_compile", action="store_true",
                       help="compile the model with torch.compile (inductor) through Accelerate's dynamo backend")

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
                       help="publish the final model to the Hub (model card included: what publish.py uploads)")
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
        kind = data_file_type(args.train_file, "--train_file")
        if args.validation_file and data_file_type(args.validation_file, "--validation_file") != kind:
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
            raise UsageError(f"--output_dir {args.output_dir!r} already holds a run ({name_list(found)}): resume it "
                             "with --resume_from_checkpoint latest, or pass --overwrite_output_dir to start a new "
                             "run there.")
    if args.push_to_hub:
        check_push_to_hub(args)


def hub_repo_id(args: argparse.Namespace) -> str:
    """--hub_model_id, else the output folder's name (HF's convention)."""
    return args.hub_model_id or Path(args.output_dir).resolve().name


def check_push_to_hub(args: argparse.Namespace) -> None:
    """Before training: a valid repository id and a Hub token, so a long run does not end in a failed upload."""
    try:
        validate_repo_id(hub_repo_id(args), flag="--hub_model_id")
        require_token()
    except PublishError as error:  # the same check as publish.py's, reported as this script's flag error
        raise UsageError(f"--push_to_hub: {error}") from None
