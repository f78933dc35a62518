"""The training loop of ``train_clm.py`` and ``train_mlm.py``: steps, periodic evaluation and checkpoints, the final
save and ``all_results.json``, then length evaluation, samples and the Hub.

Programmatic use (the quality benchmark does this)::

    args = parse_args("clm", ["--config_name", "tiny", "--max_train_steps", "10"])
    outcome = run(args, "clm", raw_datasets=my_dataset_dict)   # outcome.results is all_results.json
"""

from __future__ import annotations

import json
import logging
import sys
import time
from pathlib import Path
from typing import Any

import torch
from datasets import DatasetDict
from tqdm.auto import tqdm

from ..common.flag_checks import UsageError
from ..common.run_files import LENGTHS_PLOT, RESULTS_FILE
from ..hub.run_inspection import DatasetRef
from ..hub.upload import push_finished_run
from .arguments import PretrainingArguments, parse_args
from .checkpoints import find_latest_checkpoint, rotate_checkpoints, save_checkpoint
from .evaluation import evaluate, evaluate_lengths, plot_lengths, position_limit
from .generation import format_generation_table, generate_sample, time_generation
from .data import DataTrainingArguments
from .setup import RunOutcome, Session, run_geometry, setup
from .sharding import save_unsharded
from .stop_signals import EXIT_CODES, StopOnSignal, TrainingInterrupted

logger = logging.getLogger(__name__)


def _checkpoint(session: Session, name: str, epoch: int) -> Path:
    state = {"completed_steps": session.completed_steps, "epoch": epoch, "steps_per_epoch": session.steps_per_epoch,
             "tokens_seen": session.tokens_seen, "geometry": run_geometry(session), **session.fingerprint}
    output_dir, limit = Path(session.args.run.output_dir), session.args.run.checkpoints_total_limit
    path = save_checkpoint(session.accelerator, output_dir, name, state, session.tokenizer)
    if session.accelerator.is_main_process:
        logger.info("Saved checkpoint %s", path)
        if limit:
            for old in rotate_checkpoints(output_dir, limit):
                logger.info("Deleted checkpoint %s (--checkpoints_total_limit %d)", old, limit)
    session.accelerator.wait_for_everyone()
    return path


def train(session: Session) -> RunOutcome:
    """The training loop, periodic evaluation and checkpoints, then the final save, all_results.json, the length
    evaluation and the optional samples and Hub upload."""
    args, accelerator, model = session.args, session.accelerator, session.model
    loop, out = args.training, args.run
    output_dir = Path(out.output_dir)
    checkpoint_every = out.checkpoint_every
    start_step = session.completed_steps
    starting_epoch = start_step // session.steps_per_epoch
    skip_batches = (start_step % session.steps_per_epoch) * loop.gradient_accumulation_steps
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
                    if accelerator.sync_gradients and loop.max_grad_norm > 0:
                        accelerator.clip_grad_norm_(model.parameters(), loop.max_grad_norm)
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
                if step % out.logging_steps == 0 or step == session.max_train_steps:
                    session.metrics.log({"epoch": epoch, "train_loss": window_loss / window_batches,
                                         "learning_rate": session.scheduler.get_last_lr()[0],
                                         "tokens_per_second": tokens_per_second,
                                         "tokens_seen": session.tokens_seen}, step)
                    window_loss, window_batches = 0.0, 0
                if out.eval_steps and step % out.eval_steps == 0:
                    eval_metrics = evaluate(model, session.eval_dataloader, accelerator, session.build_inputs,
                                            loop.seed)
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
            if out.eval_steps is None and session.completed_steps != last_eval_step:
                eval_metrics = evaluate(model, session.eval_dataloader, accelerator, session.build_inputs, loop.seed)
                session.metrics.log({"epoch": epoch, **eval_metrics}, session.completed_steps)
                say(f"epoch {epoch}: eval_loss {eval_metrics['eval_loss']:.4f}, "
                    f"perplexity {eval_metrics['perplexity']:.2f}")
                last_eval_step = session.completed_steps
            if out.checkpointing_steps == "epoch":
                _checkpoint(session, f"epoch_{epoch}", epoch)
            if session.completed_steps >= session.max_train_steps:
                break
    progress.close()
    runtime = time.time() - start_time
    if last_eval_step != session.completed_steps or eval_metrics is None:
        eval_metrics = evaluate(model, session.eval_dataloader, accelerator, session.build_inputs, loop.seed)
        session.metrics.log({"epoch": epoch, **eval_metrics}, session.completed_steps)

    accelerator.wait_for_everyone()
    if session.sharded:  # the shards gathered into one model.safetensors
        unwrapped = save_unsharded(model, accelerator, output_dir)
    else:
        unwrapped = accelerator.unwrap_model(model)
        unwrapped.save_pretrained(output_dir, is_main_process=accelerator.is_main_process,
                                  save_function=accelerator.save)
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
        "block_size": loop.block_size,
    }
    outcome = RunOutcome(results=results, model=unwrapped, tokenizer=session.tokenizer,
                         eval_stream=session.eval_stream)
    if accelerator.is_main_process:
        print(f"eval_loss {eval_metrics['eval_loss']:.4f}  validation perplexity {eval_metrics['perplexity']:.2f}")
        if out.eval_length_list:
            _length_evaluation(session, unwrapped, results, output_dir)
        sampling = args.sampling
        for prompt in (sampling.sample_prompt if sampling is not None else None) or []:
            text = generate_sample(unwrapped, session.tokenizer, prompt, sampling.sample_max_new_tokens, loop.seed)
            outcome.samples.append(text)
            print(f"--- sample ---\n{text}\n")
        if sampling is not None and sampling.time_generation_list:
            rows = time_generation(unwrapped, sampling.time_generation_list, seed=loop.seed)
            results["generation_ms_per_token"] = rows
            print("Per-token generation time against the context length (batch 1, greedy, median of 8 tokens):")
            print(format_generation_table(rows))
        (output_dir / RESULTS_FILE).write_text(json.dumps(results, indent=2))
        if out.push_to_hub:
            url = push_finished_run(output_dir, out.hub_repo_id(), _dataset_ref(args.data),
                                    commit_message=f"train_{args.task}: step {session.completed_steps}")
            print(f"pushed to {url}")
    accelerator.wait_for_everyone()
    accelerator.end_training()
    return outcome


def _dataset_ref(data: DataTrainingArguments) -> DatasetRef:
    """The evaluation data as the model card names it."""
    if data.dataset_name:
        return DatasetRef(hub_id=data.dataset_name, name=data.dataset_name, config=data.dataset_config_name,
                          split="validation")
    name = Path(data.train_file).name if data.train_file else "CPython pydoc topics (embedded corpus)"
    return DatasetRef(name=name, split="validation")


def _length_evaluation(session: Session, model: torch.nn.Module, results: dict[str, Any], output_dir: Path) -> None:
    loop, lengths = session.args.training, session.args.run.eval_length_list
    limit = position_limit(model)
    window = limit if limit is not None and limit < lengths[-1] else None
    by_length = evaluate_lengths(model, session.eval_stream, lengths, window=window,
                                 batch_size=loop.per_device_eval_batch_size, build_inputs=session.build_inputs,
                                 seed=loop.seed)
    results["eval_lengths"] = {str(length): values for length, values in by_length.items()}
    print("| eval length | perplexity | scored tokens | mode |\n|---|---|---|---|")
    for length, values in by_length.items():
        print(f"| {length} | {values['perplexity']:.2f} | {values['tokens']} | {values['mode']} |")
    plot_lengths({type(model).__name__: {length: v["perplexity"] for length, v in by_length.items()}},
                 output_dir / LENGTHS_PLOT, train_length=loop.block_size)


def run(args: PretrainingArguments, task: str, raw_datasets: DatasetDict | None = None) -> RunOutcome:
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
        if session.accelerator.is_main_process:  # every rank stops and exits; one line tells the user how to resume
            print(f"{script}: stopped by {stop.signal_name} at step {stop.step}; saved checkpoint {stop.checkpoint}; "
                  f"resume with --resume_from_checkpoint {stop.checkpoint}", file=sys.stderr)
        raise SystemExit(stop.exit_code) from None
    except KeyboardInterrupt:
        latest = find_latest_checkpoint(args.run.output_dir)
        where = (f"; the newest checkpoint is {latest}: resume with --resume_from_checkpoint {latest}" if latest
                 else "; no checkpoint was written")
        print(f"{script}: interrupted{where}", file=sys.stderr)
        raise SystemExit(EXIT_CODES["SIGINT"]) from None
