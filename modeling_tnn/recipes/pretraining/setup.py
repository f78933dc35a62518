"""Everything before the first training step of ``train_clm.py`` / ``train_mlm.py``: flags checked, data, tokenizer,
model, optimizer, schedule and Accelerate prepared, a checkpoint verified and restored. The parsed flags
(:class:`~.arguments.PretrainingArguments`) stop here: the loop and the finish get a :class:`~.session.Session`
holding their :class:`~.session.Schedule` and :class:`~.session.FinishSpec`."""

from __future__ import annotations

import json
import logging
import math
import os
from pathlib import Path
from typing import Any

import torch
from accelerate import Accelerator
from accelerate.utils import set_seed
from datasets import DatasetDict
from torch.utils.data import DataLoader
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoModelForMaskedLM,
    PreTrainedTokenizerBase,
    default_data_collator,
    get_scheduler,
)

from modeling_tnn import list_presets, load_preset

from ..common.flag_checks import UsageError, first_line, hub_hint, name_list
from ..common.run_files import METRICS_FILE, TRAINER_STATE
from ..hub.run_inspection import DatasetRef
from .arguments import (
    DEFAULT_CONFIG,
    ModelArguments,
    PretrainingArguments,
    SamplingArguments,
    parse_config_overrides,
)
from .checkpoints import (
    checkpoint_differences,
    clear_previous_run,
    model_fingerprint,
    tokenizer_fingerprint,
)
from .data import (
    DataTrainingArguments,
    EpochShuffleSampler,
    is_text_feature,
    load_raw_datasets,
    load_tokenizer,
    text_column_of,
    tokenize_and_group,
    train_tokenizer,
)
from .evaluation import InputBuilder, position_limit
from .session import FinishSpec, Schedule, Session
from .sharding import fsdp_plugin, fsdp_requested, prepare_sharded, refuse_ignored_deepspeed
from .tracking import MetricsLog, available_trackers, silence_tied_weight_warning

logger = logging.getLogger(__name__)


def resolve_config(model_args: ModelArguments):
    """The model config from --model_name_or_path, or --config_name (preset name, JSON file, folder) with
    --config_overrides. Raises :class:`UsageError` for a missing file, an unknown preset or an unknown field."""
    if model_args.model_name_or_path:  # a saved folder, or a Hub id for users online
        try:
            return AutoConfig.from_pretrained(model_args.model_name_or_path, trust_remote_code=model_args.trust_remote_code)
        except (OSError, ValueError) as error:
            raise UsageError(f"--model_name_or_path {model_args.model_name_or_path!r}: {hub_hint(model_args.model_name_or_path)}"
                             f"{first_line(error)}") from None
    name = model_args.config_name or DEFAULT_CONFIG
    overrides = parse_config_overrides(model_args.config_overrides)
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
            config = AutoConfig.from_pretrained(str(config_file), trust_remote_code=model_args.trust_remote_code)
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


def build_model(model_args: ModelArguments, task: str, config, tokenizer: PreTrainedTokenizerBase) -> torch.nn.Module:
    """A new ``task`` model (``clm``/``mlm``) from ``config`` sized to the tokenizer, or the --model_name_or_path
    model."""
    auto = AutoModelForCausalLM if task == "clm" else AutoModelForMaskedLM
    if model_args.model_name_or_path:
        model = auto.from_pretrained(model_args.model_name_or_path, config=config, trust_remote_code=model_args.trust_remote_code)
        if len(tokenizer) > model.get_input_embeddings().weight.shape[0]:
            model.resize_token_embeddings(len(tokenizer))
        return model
    if "vocab_size" in parse_config_overrides(model_args.config_overrides):
        if config.vocab_size < len(tokenizer):
            raise UsageError(f"--config_overrides vocab_size={config.vocab_size} is smaller than the tokenizer "
                             f"({len(tokenizer)} tokens).")
    else:
        config.vocab_size = len(tokenizer)
    for name in ("pad_token_id", "bos_token_id", "eos_token_id"):
        if getattr(tokenizer, name, None) is not None:
            setattr(config, name, getattr(tokenizer, name))
    if task == "mlm" and tokenizer.mask_token is None:
        raise UsageError("train_mlm needs a tokenizer with a mask token; --tokenizer_name has none.")
    try:
        return auto.from_config(config, trust_remote_code=model_args.trust_remote_code)
    except ValueError as error:  # e.g. causal=false for a causal LM: name the flags that set it
        raise UsageError(f"--config_name/--config_overrides: {error}") from None


def get_tokenizer(model: ModelArguments, task: str, resume_path: Path | None, output_dir: str, raw: DatasetDict,
                  accelerator: Accelerator, text_column: str) -> PreTrainedTokenizerBase:
    """The tokenizer: --tokenizer_name, the resumed checkpoint's, --model_name_or_path's, or a byte-level BPE trained
    on the training split (saved in --output_dir). A causal LM's pads on the left, transformers' decoder-only
    convention, so that the folder it is saved in serves a batched ``generate(**tokenizer(prompts, padding=True))``
    (right padding would put pad tokens between a prompt and its continuation); training packs blocks, no padding."""
    tokenizer = None
    for source, flag in ((model.tokenizer_name, "--tokenizer_name"), (resume_path, "--resume_from_checkpoint"),
                         (model.model_name_or_path, "--model_name_or_path")):
        if source:
            tokenizer = load_tokenizer(str(source), flag, model.trust_remote_code)
            break
    if tokenizer is None:
        tokenizer = train_tokenizer(raw, text_column, model.vocab_size, task == "mlm", output_dir, accelerator)
    if task == "clm":  # init_kwargs is what save_pretrained writes to tokenizer_config.json
        tokenizer.padding_side = tokenizer.init_kwargs["padding_side"] = "left"
    return tokenizer


def optimizer_groups(model: torch.nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    """AdamW groups: weight decay on matrices only (not on biases and norm weights, as HF's scripts)."""
    decay = [p for p in model.parameters() if p.requires_grad and p.ndim >= 2]
    no_decay = [p for p in model.parameters() if p.requires_grad and p.ndim < 2]
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def _reset_single_process_state() -> None:
    # Accelerate keeps process-wide singletons; tests and the benchmark run several trainings in one process.
    if int(os.environ.get("WORLD_SIZE", "1")) == 1:
        from accelerate.state import AcceleratorState, GradientState

        AcceleratorState._reset_state(reset_partial_state=True)
        GradientState._reset_state()


def setup(args: PretrainingArguments, task: str, raw_datasets: DatasetDict | None = None) -> Session:
    """Validate the flags, load data, build tokenizer, model, optimizer and schedule, restore a checkpoint. Every
    input error raises ``ValueError`` (:class:`UsageError`) here, before any training step. ``task`` must be the
    one ``args`` were parsed for."""
    if task != args.task:
        raise ValueError(f"setup({task!r}) got the arguments of train_{args.task}.")
    args.check()
    data_args, loop, out = args.data, args.training, args.run
    config = resolve_config(args.model)
    trackers = available_trackers(out.report_to)
    _reset_single_process_state()
    # Several processes and no accelerator device: without cpu=True Accelerate would run them as independent jobs.
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    has_device = torch.accelerator.is_available() if hasattr(torch, "accelerator") else torch.cuda.is_available()
    accelerator = Accelerator(cpu=world_size > 1 and not has_device,
                              gradient_accumulation_steps=loop.gradient_accumulation_steps,
                              mixed_precision=loop.mixed_precision, log_with=trackers or None,
                              project_dir=out.output_dir, fsdp_plugin=fsdp_plugin() if loop.fsdp else None,
                              dynamo_backend="inductor" if loop.torch_compile else None)
    refuse_ignored_deepspeed(accelerator)
    sharded = fsdp_requested(loop.fsdp, accelerator)
    # Our own progress lines at INFO on the main process; other libraries' chatter only from WARNING up.
    logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s", level=logging.WARNING)
    # (on the recipes' parent logger: setup, the loop, checkpoints and tracking each log under their module's name)
    logging.getLogger(__package__).setLevel(logging.INFO if accelerator.is_main_process else logging.ERROR)
    set_seed(loop.seed, device_specific=True)  # dropout differs across processes; DDP broadcasts rank 0's init
    silence_tied_weight_warning()
    output_dir = Path(out.output_dir)
    if accelerator.is_main_process:
        if out.overwrite_output_dir and not args.resume_path:
            deleted = clear_previous_run(output_dir)
            if deleted:
                logger.info("--overwrite_output_dir: deleted %s from %s", name_list(deleted, 8), output_dir)
        output_dir.mkdir(parents=True, exist_ok=True)
        if not args.resume_path:  # a new run starts a new log; a resumed one appends
            (output_dir / METRICS_FILE).unlink(missing_ok=True)
    accelerator.wait_for_everyone()

    with accelerator.main_process_first():
        raw = raw_datasets if raw_datasets is not None else load_raw_datasets(data_args)
    for split in ("train", "validation"):
        if split not in raw:
            raise UsageError(f"The dataset has no {split!r} split (splits: {list(raw)}).")
    for split in ("train", "validation"):
        if len(raw[split]) == 0:
            raise UsageError(f"{data_args.source(split)} has no rows.")
    text_column = text_column_of(raw["train"], data_args.text_column, data_args.source("train"))
    if text_column not in raw["validation"].column_names or not is_text_feature(
            raw["validation"].features[text_column]):
        text_column_of(raw["validation"], text_column, data_args.source("validation"))  # raises, naming the file
    tokenizer = get_tokenizer(args.model, task, args.resume_path, out.output_dir, raw, accelerator, text_column)
    data, stream = tokenize_and_group(data_args, raw, tokenizer, accelerator, text_column,
                                      block_size=loop.block_size, masked=task == "mlm",
                                      eval_lengths=out.eval_length_list)
    model = build_model(args.model, task, config, tokenizer)
    silence_tied_weight_warning(model)
    if data_args.packing == "documents" and loop.torch_compile:
        raise UsageError("--packing documents lays out each batch's documents on the host, which a compiled model "
                         "cannot: drop --torch_compile or use --packing concatenate.")
    if data_args.packing == "documents" and getattr(model.config, "model_type", None) != "tnn":
        raise UsageError(f"--packing documents: {type(model).__name__} does not mix documents apart from their "
                         "position_ids; use a TNN model or --packing concatenate.")
    limit = position_limit(model)
    if limit is not None and loop.block_size > limit:
        raise UsageError(f"--block_size {loop.block_size} exceeds the model's position table ({limit}).")
    if accelerator.is_main_process:
        logger.info("%s: %.2fM parameters, %d training blocks of %d tokens, %d validation blocks",
                    type(model).__name__, model.num_parameters() / 1e6, len(data["train"]), loop.block_size,
                    len(data["validation"]))

    # Each DataLoader iterator draws a base seed from its generator, by default the global RNG: a private generator
    # keeps the iterator a resumed run creates mid-epoch from shifting the dropout/masking RNG.
    train_dataloader = DataLoader(data["train"], sampler=EpochShuffleSampler(len(data["train"]), loop.seed),
                                  batch_size=loop.per_device_train_batch_size, collate_fn=default_data_collator,
                                  generator=torch.Generator().manual_seed(loop.seed))
    eval_dataloader = DataLoader(data["validation"], batch_size=loop.per_device_eval_batch_size,
                                 collate_fn=default_data_collator, generator=torch.Generator().manual_seed(loop.seed))
    def new_optimizer(module: torch.nn.Module) -> torch.optim.Optimizer:
        return torch.optim.AdamW(optimizer_groups(module, loop.weight_decay), lr=loop.learning_rate)

    if sharded:  # the optimizer is built on the sharded parameters
        model, optimizer, train_dataloader, eval_dataloader = prepare_sharded(
            accelerator, model, new_optimizer, train_dataloader, eval_dataloader)
    else:
        model, optimizer, train_dataloader, eval_dataloader = accelerator.prepare(
            model, new_optimizer(model), train_dataloader, eval_dataloader)
    steps_per_epoch = math.ceil(len(train_dataloader) / loop.gradient_accumulation_steps)
    max_train_steps = loop.max_train_steps or loop.num_train_epochs * steps_per_epoch
    num_train_epochs = math.ceil(max_train_steps / steps_per_epoch)
    # Accelerate's prepared scheduler steps once per process at each optimizer step (HF's scripts scale likewise).
    scheduler = get_scheduler(loop.lr_scheduler_type, optimizer=optimizer,
                              num_warmup_steps=loop.num_warmup_steps * accelerator.num_processes,
                              num_training_steps=max_train_steps * accelerator.num_processes)
    scheduler = accelerator.prepare(scheduler)
    if trackers:
        hparams = {k: v for k, v in {**args.flags(), "task": task}.items() if isinstance(v, (int, float, str, bool))}
        accelerator.init_trackers(f"train_{task}", config=hparams)

    schedule = Schedule(max_train_steps=max_train_steps, steps_per_epoch=steps_per_epoch,
                        num_train_epochs=num_train_epochs,
                        gradient_accumulation_steps=loop.gradient_accumulation_steps,
                        max_grad_norm=loop.max_grad_norm, logging_steps=out.logging_steps, eval_steps=out.eval_steps,
                        checkpoint_every=out.checkpoint_every,
                        checkpoint_each_epoch=out.checkpointing_steps == "epoch",
                        checkpoints_total_limit=out.checkpoints_total_limit, output_dir=output_dir, seed=loop.seed)
    sampling = args.sampling or SamplingArguments()  # train_mlm.py has no sampling flags: none asked for
    finish = FinishSpec(output_dir=output_dir, block_size=loop.block_size,
                        eval_batch_size=loop.per_device_eval_batch_size, seed=loop.seed,
                        eval_lengths=out.eval_length_list, sample_prompts=list(sampling.sample_prompt or []),
                        sample_max_new_tokens=sampling.sample_max_new_tokens,
                        time_generation=sampling.time_generation_list,
                        hub_repo_id=out.hub_repo_id() if out.push_to_hub else None,
                        dataset=dataset_ref(data_args) if out.push_to_hub else None)
    # The data layout a checkpoint records and a resumed run must repeat.
    geometry = {"train_blocks": len(data["train"]), "block_size": loop.block_size,
                "per_device_train_batch_size": loop.per_device_train_batch_size,
                "gradient_accumulation_steps": loop.gradient_accumulation_steps,
                "num_processes": accelerator.num_processes, "seed": loop.seed, "fsdp": sharded}
    masking = args.masking.mlm_probability if args.masking is not None else None
    session = Session(task=task, accelerator=accelerator, model=model, tokenizer=tokenizer, optimizer=optimizer,
                      scheduler=scheduler, train_dataloader=train_dataloader, eval_dataloader=eval_dataloader,
                      build_inputs=InputBuilder(task, tokenizer, masking),
                      metrics=MetricsLog(accelerator, output_dir, bool(trackers)), eval_stream=stream,
                      schedule=schedule, finish=finish,
                      fingerprint={"model_config": model_fingerprint(accelerator.unwrap_model(model)),
                                   "tokenizer": tokenizer_fingerprint(tokenizer)},
                      geometry=geometry, sharded=sharded)
    if args.resume_path:
        _restore(session, Path(args.resume_path))
    return session


def dataset_ref(data: DataTrainingArguments) -> DatasetRef:
    """The evaluation data as the model card names it."""
    if data.dataset_name:
        return DatasetRef(hub_id=data.dataset_name, name=data.dataset_name, config=data.dataset_config_name,
                          split="validation")
    name = Path(data.train_file).name if data.train_file else "CPython pydoc topics (embedded corpus)"
    return DatasetRef(name=name, split="validation")


def _restore(session: Session, path: Path) -> None:
    """Check that the checkpoint belongs to this run (model config, tokenizer, data geometry), then load it.
    Raises :class:`UsageError` naming every differing field, before anything is loaded."""
    state = json.loads((path / TRAINER_STATE).read_text())
    differences = checkpoint_differences(state, {**session.fingerprint, "geometry": session.geometry})
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
