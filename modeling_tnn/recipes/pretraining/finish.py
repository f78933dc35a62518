"""After the last step of ``train_clm.py`` / ``train_mlm.py``, as its :class:`~.session.FinishSpec` says: the final
save of the model and tokenizer, ``all_results.json``, the length evaluation and its plot, samples, the generation
timing, and the Hub upload."""

from __future__ import annotations

import json
from typing import Any

import torch

from ..common.run_files import LENGTHS_PLOT, RESULTS_FILE
from ..hub.upload import push_finished_run
from .evaluation import evaluate_lengths, plot_lengths, position_limit
from .generation import format_generation_table, generate_sample, time_generation
from .session import FinishSpec, LoopResult, RunOutcome, Session
from .sharding import save_unsharded


def finish_run(session: Session, loop: LoopResult) -> RunOutcome:
    """Save the trained model and tokenizer into ``session.finish.output_dir``, then (main process) the length
    evaluation, samples and generation timing it asks for, ``all_results.json`` and the Hub upload."""
    spec, accelerator, model = session.finish, session.accelerator, session.model
    output_dir = spec.output_dir
    accelerator.wait_for_everyone()
    if session.sharded:  # the shards gathered into one model.safetensors
        unwrapped = save_unsharded(model, accelerator, output_dir)
    else:
        unwrapped = accelerator.unwrap_model(model)
        unwrapped.save_pretrained(output_dir, is_main_process=accelerator.is_main_process,
                                  save_function=accelerator.save)
    if accelerator.is_main_process:
        session.tokenizer.save_pretrained(output_dir)

    eval_metrics = loop.eval_metrics
    results: dict[str, Any] = {
        **eval_metrics,
        "train_loss": loop.train_loss,
        "train_runtime": loop.runtime,
        "train_steps": session.completed_steps,
        "train_tokens": session.tokens_seen,
        "train_tokens_per_second": loop.tokens_per_second,
        "epoch": loop.epoch,
        "num_parameters": unwrapped.num_parameters(),
        "num_processes": accelerator.num_processes,
        "block_size": spec.block_size,
    }
    outcome = RunOutcome(results=results, model=unwrapped, tokenizer=session.tokenizer,
                         eval_stream=session.eval_stream)
    if accelerator.is_main_process:
        print(f"eval_loss {eval_metrics['eval_loss']:.4f}  validation perplexity {eval_metrics['perplexity']:.2f}")
        if spec.eval_lengths:
            _length_evaluation(session, unwrapped, results, spec)
        for prompt in spec.sample_prompts:
            text = generate_sample(unwrapped, session.tokenizer, prompt, spec.sample_max_new_tokens, spec.seed)
            outcome.samples.append(text)
            print(f"--- sample ---\n{text}\n")
        if spec.time_generation:
            rows = time_generation(unwrapped, spec.time_generation, seed=spec.seed)
            results["generation_ms_per_token"] = rows
            print("Per-token generation time against the context length (batch 1, greedy, median of 8 tokens):")
            print(format_generation_table(rows))
        (output_dir / RESULTS_FILE).write_text(json.dumps(results, indent=2))
        if spec.hub_repo_id is not None:
            url = push_finished_run(output_dir, spec.hub_repo_id, spec.dataset,
                                    commit_message=f"train_{session.task}: step {session.completed_steps}")
            print(f"pushed to {url}")
    accelerator.wait_for_everyone()
    accelerator.end_training()
    return outcome


def _length_evaluation(session: Session, model: torch.nn.Module, results: dict[str, Any], spec: FinishSpec) -> None:
    lengths = spec.eval_lengths
    limit = position_limit(model)
    window = limit if limit is not None and limit < lengths[-1] else None
    by_length = evaluate_lengths(model, session.eval_stream, lengths, window=window,
                                 batch_size=spec.eval_batch_size, build_inputs=session.build_inputs, seed=spec.seed)
    results["eval_lengths"] = {str(length): values for length, values in by_length.items()}
    print("| eval length | perplexity | scored tokens | mode |\n|---|---|---|---|")
    for length, values in by_length.items():
        print(f"| {length} | {values['perplexity']:.2f} | {values['tokens']} | {values['mode']} |")
    plot_lengths({type(model).__name__: {length: v["perplexity"] for length, v in by_length.items()}},
                 spec.output_dir / LENGTHS_PLOT, train_length=spec.block_size)
