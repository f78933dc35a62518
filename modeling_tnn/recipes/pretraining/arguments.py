"""The command line of ``train_clm.py`` and ``train_mlm.py`` (the flags of Hugging Face's ``run_clm_no_trainer.py`` /
``run_mlm_no_trainer.py``) as typed argument groups, one dataclass per ``--help`` section, and their checks before
training. Each part of the pretraining takes the group it needs (the data code :class:`~.data.DataTrainingArguments`,
the model code :class:`ModelArguments`, ...); a new flag is a new field of its group (see
:mod:`..common.argument_groups`), a new section a new dataclass in :data:`ARGUMENT_GROUPS`."""

from __future__ import annotations

import argparse
import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from transformers import (
    SchedulerType,
)

from modeling_tnn import list_presets

from ..common.argument_groups import add_dataclass_arguments, flag, from_namespace, to_argv
from ..common.flag_checks import UsageError, check_local_path, name_list
from ..common.run_files import METRICS_FILE, RESULTS_FILE, TOKENIZER_FILES
from ..hub.folder import require_token, validate_repo_id
from ..hub.run_inspection import PublishError
from .checkpoints import is_valid_checkpoint, resolve_checkpoint, run_files_in
from .data import DataTrainingArguments

TASKS = ("clm", "mlm")
DEFAULT_CONFIG = "small"


def _require_positive(group: Any, required: tuple[str, ...], optional: tuple[str, ...] = ()) -> None:
    """``--name must be a positive integer`` for each ``required`` field below 1, and each ``optional`` one that is
    set and below 1."""
    for name in required + optional:
        value = getattr(group, name)
        if (name in required or value is not None) and (value is None or value < 1):
            raise UsageError(f"--{name} must be a positive integer, got {value}.")


@dataclass
class ModelArguments:
    """The ``model and tokenizer`` flags: a saved model to continue, or a config to build one; the tokenizer."""

    title = "model and tokenizer"

    model_name_or_path: str | None = flag(help="continue training from a saved model folder")
    config_name: str | None = flag(help=f"a preset ({', '.join(list_presets())}), a JSON file or a folder with "
                                        f"config.json (default: {DEFAULT_CONFIG})")
    config_overrides: str | None = flag(help='comma-separated k=v config fields, e.g. "hidden_size=64,dropout=0"; '
                                             "values are parsed as JSON where possible")
    tokenizer_name: str | None = flag(help="a tokenizer folder; without it a byte-level BPE is trained on the "
                                           "training split")
    vocab_size: int = flag(8192, "vocabulary of the trained BPE (261 = bytes + specials, no merges: character "
                                 "level)", type=int)
    trust_remote_code: bool = flag(False, "allow model code from the model folder", action="store_true")

    def check(self) -> None:
        """Raise :class:`UsageError` for model and tokenizer flags that cannot work, before anything is loaded."""
        if self.model_name_or_path:
            if self.config_name or self.config_overrides:
                raise UsageError("--config_name/--config_overrides build a new model; they cannot be combined with "
                                 "--model_name_or_path (which continues from a saved one).")
            check_model_folder(self.model_name_or_path)
        if self.config_name:
            check_local_path("--config_name", self.config_name, "file or folder")
        if self.tokenizer_name:
            check_local_path("--tokenizer_name", self.tokenizer_name)
            folder = Path(self.tokenizer_name)
            if folder.is_dir() and not any((folder / name).is_file() for name in TOKENIZER_FILES):
                raise UsageError(f"--tokenizer_name {self.tokenizer_name!r} is a folder without tokenizer files "
                                 f"(none of {', '.join(TOKENIZER_FILES)}).")
        if self.vocab_size < 261:
            raise UsageError(f"--vocab_size must be at least 261 (256 bytes + 5 special tokens), got "
                             f"{self.vocab_size}.")


@dataclass
class TrainingLoopArguments:
    """The ``training`` flags: sequence length, batches, optimizer and schedule, seed and precision."""

    title = "training"

    block_size: int = flag(256, "training sequence length in tokens", type=int)
    per_device_train_batch_size: int = flag(8, type=int)
    per_device_eval_batch_size: int = flag(8, type=int)
    gradient_accumulation_steps: int = flag(1, type=int)
    learning_rate: float = flag(1e-3, "peak learning rate (from-scratch default, higher than HF's fine-tuning 5e-5)",
                                type=float)
    weight_decay: float = flag(0.0, "AdamW weight decay (not on biases/norms)", type=float)
    max_grad_norm: float = flag(1.0, "gradient clipping; 0 disables it", type=float)
    num_warmup_steps: int = flag(0, type=int)
    lr_scheduler_type: str = flag("linear", choices=[t.value for t in SchedulerType])
    num_train_epochs: int = flag(3, type=int)
    max_train_steps: int | None = flag(type=int, help="optimizer steps; overrides --num_train_epochs")
    seed: int = flag(42, type=int)
    mixed_precision: str | None = flag(choices=["no", "fp16", "bf16"],
                                       help="default: what `accelerate launch`/`accelerate config` says, else no")
    fsdp: bool = flag(False, "shard the model and optimizer over the processes with FSDP2 (each TnnBlock a unit): "
                      "Accelerate's FSDP plugin on GPUs, torch's fully_shard over gloo on CPU processes; also on "
                      "when `accelerate launch --use_fsdp` says so", action="store_true")
    torch_compile: bool = flag(False, "compile the model with torch.compile (inductor) through Accelerate's dynamo "
                               "backend", action="store_true")

    def check(self) -> None:
        """Raise :class:`UsageError` for loop flags that cannot work."""
        _require_positive(self, ("block_size", "per_device_train_batch_size", "per_device_eval_batch_size",
                                 "gradient_accumulation_steps", "num_train_epochs"), ("max_train_steps",))
        if self.block_size < 2:
            raise UsageError(f"--block_size must be at least 2, got {self.block_size}.")
        if self.learning_rate <= 0 or self.weight_decay < 0 or self.num_warmup_steps < 0 or self.max_grad_norm < 0:
            raise UsageError("--learning_rate must be > 0 and --weight_decay, --num_warmup_steps, --max_grad_norm "
                             ">= 0.")


@dataclass
class RunArguments:
    """The ``evaluation, checkpoints and outputs`` flags: the output folder, checkpoints and resuming, evaluation
    and logging, trackers, the Hub."""

    title = "evaluation, checkpoints and outputs"

    output_dir: str | None = flag()  # default: outputs/train_<task> (set by build_parser)
    overwrite_output_dir: bool = flag(
        False, "start a new run in an --output_dir that holds another run: its checkpoints, "
               f"{METRICS_FILE} and {RESULTS_FILE} are deleted first (without this flag such a folder is refused "
               "unless you resume)", action="store_true")
    checkpointing_steps: str | None = flag(help="an integer (every n steps) or 'epoch'")
    checkpoints_total_limit: int | None = flag(
        type=int, help="keep only the newest N checkpoints (older ones are deleted after each save)")
    resume_from_checkpoint: str | None = flag(
        help="a checkpoint folder, or 'latest' (newest in --output_dir); its model config, tokenizer and data "
             "geometry must match this run")
    eval_steps: int | None = flag(type=int, help="evaluate every n steps (default: each epoch and the end)")
    logging_steps: int = flag(10, "log the training loss every n steps", type=int)
    eval_lengths: str | None = flag(
        help="comma-separated evaluation lengths, e.g. 512,1024,2048,4096: validation perplexity at each (full "
             "windows; sliding windows for models with a position table)")
    report_to: str = flag("tensorboard", "trackers besides the JSONL file: 'tensorboard', 'wandb', ..., 'all' or "
                                         "'none' (a tracker whose package is missing is skipped)")
    with_tracking: bool = flag(False, argparse.SUPPRESS, action="store_true")  # HF compatibility, no-op
    push_to_hub: bool = flag(False, "publish the final model to the Hub (model card included: what publish.py "
                                    "uploads)", action="store_true")
    hub_model_id: str | None = flag(help="repository id for --push_to_hub (default: --output_dir's name)")

    @property
    def eval_length_list(self) -> list[int]:
        """--eval_lengths as sorted unique integers (empty without the flag)."""
        return parse_lengths(self.eval_lengths)

    @property
    def checkpoint_every(self) -> int | None:
        """--checkpointing_steps as a step count (``None`` for ``epoch`` or no periodic checkpoints)."""
        return int(self.checkpointing_steps) if (self.checkpointing_steps or "").isdigit() else None

    def hub_repo_id(self) -> str:
        """--hub_model_id, else the output folder's name (HF's convention)."""
        return self.hub_model_id or Path(self.output_dir).resolve().name

    def check(self) -> Path | None:
        """Raise :class:`UsageError` for output, checkpoint and Hub flags that cannot work; returns the checkpoint
        --resume_from_checkpoint names (``None`` for a new run). A folder that holds another run is refused here,
        by every process before any of them writes."""
        _require_positive(self, ("logging_steps",), ("eval_steps",))
        if self.checkpoints_total_limit is not None and self.checkpoints_total_limit < 1:
            raise UsageError(f"--checkpoints_total_limit must be a positive integer, got "
                             f"{self.checkpoints_total_limit}.")
        if self.checkpointing_steps is not None and self.checkpointing_steps != "epoch":
            if not self.checkpointing_steps.isdigit() or int(self.checkpointing_steps) < 1:
                raise UsageError(f"--checkpointing_steps must be a positive integer or 'epoch', "
                                 f"got {self.checkpointing_steps!r}.")
        parse_lengths(self.eval_lengths)  # a bad value fails now, not after training
        resume_path = None
        if self.resume_from_checkpoint:
            if self.overwrite_output_dir:
                raise UsageError("--overwrite_output_dir starts a new run; it cannot be combined with "
                                 "--resume_from_checkpoint.")
            resume_path = resolve_checkpoint(self.resume_from_checkpoint, self.output_dir)
        else:
            found = run_files_in(self.output_dir)
            if found and not self.overwrite_output_dir:
                raise UsageError(f"--output_dir {self.output_dir!r} already holds a run ({name_list(found)}): resume "
                                 "it with --resume_from_checkpoint latest, or pass --overwrite_output_dir to start a "
                                 "new run there.")
        if self.push_to_hub:
            check_push_to_hub(self.hub_repo_id())
        return resume_path


@dataclass
class MaskingArguments:
    """train_mlm.py's masking flag."""

    title = None  # listed with the general options

    mlm_probability: float = flag(0.15, "fraction of tokens masked", type=float)

    def check(self) -> None:
        if not 0 < self.mlm_probability < 1:
            raise UsageError(f"--mlm_probability must lie in (0, 1), got {self.mlm_probability}.")


@dataclass
class SamplingArguments:
    """train_clm.py's flags for after training: sample continuations, time generation."""

    title = None  # listed with the general options

    sample_prompt: list[str] | None = flag(
        help="after training, generate a continuation of this prompt (repeatable)", action="append")
    sample_max_new_tokens: int = flag(60, type=int)
    time_generation: str | None = flag(
        help="after training, print the per-token generation time at these comma-separated context lengths (e.g. "
             "128,512,2048), with the recurrent cache and with a full recompute per token")

    @property
    def time_generation_list(self) -> list[int]:
        """--time_generation as sorted unique integers (empty without the flag)."""
        return parse_lengths(self.time_generation, "--time_generation")

    def check(self) -> None:
        parse_lengths(self.time_generation, "--time_generation")  # a bad value fails now, not after training


# (attribute of PretrainingArguments, its dataclass, the tasks whose command line has it), in --help order.
ARGUMENT_GROUPS = (
    ("data", DataTrainingArguments, TASKS),
    ("model", ModelArguments, TASKS),
    ("training", TrainingLoopArguments, TASKS),
    ("run", RunArguments, TASKS),
    ("masking", MaskingArguments, ("mlm",)),
    ("sampling", SamplingArguments, ("clm",)),
)


@dataclass
class PretrainingArguments:
    """Every flag of ``train_clm.py`` (``task="clm"``) or ``train_mlm.py`` (``task="mlm"``), by group."""

    task: str
    data: DataTrainingArguments
    model: ModelArguments
    training: TrainingLoopArguments
    run: RunArguments
    masking: MaskingArguments | None = None  # train_mlm.py only
    sampling: SamplingArguments | None = None  # train_clm.py only
    resume_path: Path | None = None  # the checkpoint --resume_from_checkpoint names, set by check()

    @classmethod
    def with_defaults(cls, task: str, **groups: Any) -> PretrainingArguments:
        """The arguments of ``task`` with the given ``groups`` (by attribute name) and every other group at its
        defaults: what :func:`parse_args` gives for the flags of those groups (see :meth:`argv`), built in code. A
        run group without ``output_dir`` writes where the script would."""
        if task not in TASKS:
            raise ValueError(f"task must be one of {TASKS}, got {task!r}.")
        names = [name for name, _, tasks in ARGUMENT_GROUPS if task in tasks]
        unknown = sorted(set(groups) - set(names))
        if unknown:
            raise ValueError(f"train_{task} has no argument group(s) {unknown}; its groups are {names}.")
        chosen = {name: groups.get(name) or group() for name, group, tasks in ARGUMENT_GROUPS if task in tasks}
        if chosen["run"].output_dir is None:
            chosen["run"] = dataclasses.replace(chosen["run"], output_dir=default_output_dir(task))
        return cls(task=task, **chosen)

    def argv(self) -> list[str]:
        """The command line of ``train_<task>.py`` that parses into these arguments (flags at their defaults
        left out)."""
        return [item for group in self.groups() for item in to_argv(group)]

    def groups(self) -> list[Any]:
        """The argument groups this task has, in --help order."""
        return [getattr(self, name) for name, _, tasks in ARGUMENT_GROUPS if self.task in tasks]

    def check(self) -> None:
        """Raise :class:`UsageError` for flag values that cannot work, before anything heavy happens, and resolve
        --resume_from_checkpoint into :attr:`resume_path`."""
        self.training.check()
        self.data.check()
        self.model.check()
        if self.masking is not None:
            self.masking.check()
        if self.sampling is not None:
            self.sampling.check()
        self.resume_path = self.run.check()

    def flags(self) -> dict[str, Any]:
        """Every flag's value by name (what the trackers record as hyper-parameters)."""
        return {name: value for group in self.groups() for name, value in dataclasses.asdict(group).items()}


def build_parser(task: str) -> argparse.ArgumentParser:
    """The argument parser of ``train_clm.py`` (``task="clm"``) or ``train_mlm.py`` (``task="mlm"``)."""
    if task not in TASKS:
        raise ValueError(f"task must be one of {TASKS}, got {task!r}.")
    kind = "a causal" if task == "clm" else "a masked (bidirectional)"
    parser = argparse.ArgumentParser(
        description=f"Pretrain {kind} TNN language model with Accelerate. Without --dataset_name or --train_file it "
        "trains on the embedded default corpus (CPython's pydoc_data.topics).")
    for _, cls, tasks in ARGUMENT_GROUPS:
        if task in tasks:
            add_dataclass_arguments(parser.add_argument_group(cls.title) if cls.title else parser, cls)
    parser.set_defaults(output_dir=default_output_dir(task))
    return parser


def default_output_dir(task: str) -> str:
    """Where ``train_<task>.py`` writes without --output_dir."""
    return f"outputs/train_{task}"


def parse_args(task: str, argv: list[str] | None = None) -> PretrainingArguments:
    """Parse ``argv`` (default: ``sys.argv[1:]``) for ``task`` into its argument groups."""
    namespace = build_parser(task).parse_args(argv)
    return PretrainingArguments(task=task, **{name: from_namespace(cls, namespace)
                                              for name, cls, tasks in ARGUMENT_GROUPS if task in tasks})


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


def check_push_to_hub(repo_id: str) -> None:
    """Before training: a valid repository id and a Hub token, so a long run does not end in a failed upload."""
    try:
        validate_repo_id(repo_id, flag="--hub_model_id")
        require_token()
    except PublishError as error:  # the same check as publish.py's, reported as this script's flag error
        raise UsageError(f"--push_to_hub: {error}") from None
