"""The training loop of ``train_clm.py`` and ``train_mlm.py``, as its :class:`~.session.Schedule` says: optimizer steps
with accumulation and clipping, the loss log, periodic evaluations and checkpoints, a checkpoint and a stop on
SIGINT/SIGTERM, and the evaluation after the last step. What follows it is :mod:`.finish`."""

from __future__ import annotations

import logging
import time
from pathlib import Path

from tqdm.auto import tqdm

from .checkpoints import rotate_checkpoints, save_checkpoint
from .evaluation import evaluate
from .session import LoopResult, Session
from .stop_signals import StopOnSignal, TrainingInterrupted

logger = logging.getLogger(__name__)


def _checkpoint(session: Session, name: str, epoch: int) -> Path:
    schedule = session.schedule
    state = {"completed_steps": session.completed_steps, "epoch": epoch, "steps_per_epoch": schedule.steps_per_epoch,
             "tokens_seen": session.tokens_seen, "geometry": session.geometry, **session.fingerprint}
    output_dir, limit = schedule.output_dir, schedule.checkpoints_total_limit
    path = save_checkpoint(session.accelerator, output_dir, name, state, session.tokenizer)
    if session.accelerator.is_main_process:
        logger.info("Saved checkpoint %s", path)
        if limit:
            for old in rotate_checkpoints(output_dir, limit):
                logger.info("Deleted checkpoint %s (--checkpoints_total_limit %d)", old, limit)
    session.accelerator.wait_for_everyone()
    return path


def train_loop(session: Session) -> LoopResult:
    """Run ``session.schedule`` from ``session.completed_steps`` (a resumed run skips the batches its checkpoint
    covered), then evaluate the last step unless its evaluation already ran. Raises :class:`TrainingInterrupted`
    after a stop signal's checkpoint."""
    schedule, accelerator, model = session.schedule, session.accelerator, session.model
    start_step = session.completed_steps
    starting_epoch = start_step // schedule.steps_per_epoch
    skip_batches = (start_step % schedule.steps_per_epoch) * schedule.gradient_accumulation_steps
    progress = tqdm(total=schedule.max_train_steps, initial=start_step, desc=f"train_{session.task}",
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
        first_epoch = starting_epoch if start_step < schedule.max_train_steps else schedule.num_train_epochs
        for epoch in range(first_epoch, schedule.num_train_epochs):
            session.train_dataloader.set_epoch(epoch)
            loader = session.train_dataloader
            if epoch == starting_epoch and skip_batches:
                loader = accelerator.skip_first_batches(session.train_dataloader, skip_batches)
                loader.set_epoch(epoch)
            for batch in loader:
                with accelerator.accumulate(model):
                    loss = model(**session.build_inputs(batch)).loss
                    accelerator.backward(loss)
                    if accelerator.sync_gradients and schedule.max_grad_norm > 0:
                        accelerator.clip_grad_norm_(model.parameters(), schedule.max_grad_norm)
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
                if step % schedule.logging_steps == 0 or step == schedule.max_train_steps:
                    session.metrics.log({"epoch": epoch, "train_loss": window_loss / window_batches,
                                         "learning_rate": session.scheduler.get_last_lr()[0],
                                         "tokens_per_second": tokens_per_second,
                                         "tokens_seen": session.tokens_seen}, step)
                    window_loss, window_batches = 0.0, 0
                if schedule.eval_steps and step % schedule.eval_steps == 0:
                    eval_metrics = evaluate(model, session.eval_dataloader, accelerator, session.build_inputs,
                                            schedule.seed)
                    session.metrics.log({"epoch": epoch, **eval_metrics}, step)
                    say(f"step {step}: eval_loss {eval_metrics['eval_loss']:.4f}, "
                        f"perplexity {eval_metrics['perplexity']:.2f}")
                    last_eval_step = step
                saved = None
                if schedule.checkpoint_every and step % schedule.checkpoint_every == 0:
                    saved = _checkpoint(session, f"step_{step}", epoch)
                stop_signal = stopper.requested(accelerator)
                if stop_signal:  # SIGINT/SIGTERM: a checkpoint of this step, then stop
                    saved = saved or _checkpoint(session, f"step_{step}", epoch)
                    progress.close()
                    accelerator.end_training()
                    raise TrainingInterrupted(stop_signal, step, saved)
                if step >= schedule.max_train_steps:
                    break
            else:  # the epoch ran to its end
                epoch_finished = True
            if not epoch_finished:
                break
            epoch_finished = False
            if schedule.eval_steps is None and session.completed_steps != last_eval_step:
                eval_metrics = evaluate(model, session.eval_dataloader, accelerator, session.build_inputs,
                                        schedule.seed)
                session.metrics.log({"epoch": epoch, **eval_metrics}, session.completed_steps)
                say(f"epoch {epoch}: eval_loss {eval_metrics['eval_loss']:.4f}, "
                    f"perplexity {eval_metrics['perplexity']:.2f}")
                last_eval_step = session.completed_steps
            if schedule.checkpoint_each_epoch:
                _checkpoint(session, f"epoch_{epoch}", epoch)
            if session.completed_steps >= schedule.max_train_steps:
                break
    progress.close()
    runtime = time.time() - start_time
    if last_eval_step != session.completed_steps or eval_metrics is None:
        eval_metrics = evaluate(model, session.eval_dataloader, accelerator, session.build_inputs, schedule.seed)
        session.metrics.log({"epoch": epoch, **eval_metrics}, session.completed_steps)
    return LoopResult(eval_metrics=eval_metrics, train_loss=run_loss / max(run_batches, 1), runtime=runtime,
                      tokens_per_second=(session.tokens_seen - start_tokens) / max(runtime, 1e-9), epoch=epoch)
