"""What ``make bench`` runs: every ``results/bench_*`` folder, each from one benchmark command, one after another,
one torch thread each. Sized to finish in about an hour and three quarters on 2 idle cores (estimated from the step
times of the published results; the run prints its own total). ``--quick`` runs the same commands at toy sizes (about nine
minutes on a busy 2-core machine): it shows every benchmark works, its numbers mean nothing.

    python run_scripts/bench_all.py                                   # make bench: regenerates results/bench_*
    python run_scripts/bench_all.py --quick --results_root outputs/bench_quick
    python run_scripts/bench_all.py --only bench_generation,bench_compact_fit
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from .harness import CLOCK, source_tree


@dataclass(frozen=True)
class Step:
    """One benchmark folder: the script that writes it, its arguments for the real run and for ``--quick``."""

    folder: str
    script: str
    full: tuple[str, ...]
    quick: tuple[str, ...]


TRAINING, GENERATION = "run_scripts/bench_training.py", "run_scripts/bench_generation.py"
SMALL_GPT_QUICK = ("--suite", "small_gpt", "--rounds", "1")
LM_QUICK = ("--hidden_size", "64", "--tokens", "256", "--rounds", "1", "--memory_lengths", "")
GENERATION_QUICK = ("--contexts", "64,256", "--batch_sizes", "1,2", "--hidden_size", "64", "--num_layers", "2",
                    "--vocab_size", "512", "--etsc_length", "64", "--rounds", "2", "--no_cache_max_context", "64",
                    "--prefill_length", "256", "--prefill_rounds", "1", "--error_multiples", "1,2",
                    "--error_tokens", "4", "--streamer_points", "1x64,2x64", "--streamer_rounds", "1",
                    "--streamer_tokens", "4", "--compiled", "0")
PLAN = (
    # The small-GPT recipe's step: TNN against GPT-2 and a minimal GPT (seconds).
    Step("bench_training/small_gpt", TRAINING, ("--suite", "small_gpt", "--rounds", "30"), SMALL_GPT_QUICK),
    Step("bench_training/small_gpt_ops", TRAINING, ("--suite", "small_gpt", "--count_ops"),
         ("--suite", "small_gpt", "--count_ops", "--models", "tnn-dense,gpt2")),
    Step("bench_training/small_gpt_profile", TRAINING, ("--suite", "small_gpt", "--profile"),
         ("--suite", "small_gpt", "--profile", "--models", "tnn-dense", "--profile_rows", "5")),
    # Width 256, 8,192 tokens per step: the causal step against Llama and GPT-2 (about 4.5 minutes).
    Step("bench_training/causal", TRAINING, ("--families", "causal", "--lengths", "128,2048", "--memory_lengths", "",
                                             "--rounds", "5"),
         ("--families", "causal", "--lengths", "64,256", *LM_QUICK)),
    # The operators of a width-256 causal step at 2,048 tokens (batch 32 of 64 tokens, 16 of 128).
    Step("bench_training/causal_ops", TRAINING, ("--families", "causal", "--lengths", "64,128", "--tokens", "2048",
                                                 "--count_ops"),
         ("--families", "causal", "--lengths", "64", "--tokens", "2048", "--hidden_size", "64", "--count_ops",
          "--models", "tnn-dense,gpt2")),
    # The masked step against BERT at long lengths (about 2.5 minutes).
    Step("bench_training/masked", TRAINING, ("--families", "masked", "--lengths", "2048,8192", "--memory_lengths", "",
                                             "--rounds", "3"),
         ("--families", "masked", "--lengths", "256", *LM_QUICK)),
    # Peak memory of one causal step, a fresh process per model and length (about 2 minutes).
    Step("bench_training/memory", TRAINING, ("--families", "causal", "--lengths", "", "--memory_lengths",
                                             "2048,8192"),
         ("--families", "causal", "--lengths", "", "--memory_lengths", "256", "--hidden_size", "64", "--tokens",
          "256", "--models", "tnn-dense,llama")),
    # LRA ListOps sizes: the classification step at n = 4,096 (batch 2).
    Step("bench_lra_speed", TRAINING, ("--suite", "lra", "--lengths", "4096", "--memory_lengths", "", "--rounds", "5"),
         ("--suite", "lra", "--lengths", "512", "--memory_lengths", "", "--tokens", "1024", "--rounds", "1",
          "--models", "tnn-dense,tnn-ski,bert")),
    # Decoding: per-token latency at 256 / 2,048 / 8,192 tokens, batch 1 and 8, state sizes, prefill, the streamer
    # clock and the cached decoder's error (about 3 minutes).
    Step("bench_generation", GENERATION, ("--contexts", "256,2048,8192", "--batch_sizes", "1,8", "--rounds", "10",
                                          "--prefill_rounds", "2", "--error_multiples", "1,4,16",
                                          "--streamer_points", "1x256,1x2048,8x256,8x2048", "--streamer_rounds", "2",
                                          "--compiled", "0"), GENERATION_QUICK),
    # TNN dense's step torch.compile'd (inductor) beside eager at 2,048 tokens, batch 1 and 8 (133 seconds in the
    # published run, the compiling included): whether the compiled path generate offers is worth taking.
    Step("bench_generation_compiled", GENERATION, ("--contexts", "2048", "--batch_sizes", "1,8", "--rounds", "10",
                                                   "--prefill_length", "2048", "--prefill_rounds", "1",
                                                   "--error_multiples", "1", "--streamer_rounds", "0",
                                                   "--compiled", "1"),
         (*GENERATION_QUICK, "--streamer_rounds", "0", "--compiled", "1")),
    Step("bench_decode_profile", GENERATION, ("--profile_only", "1"), (*GENERATION_QUICK, "--profile_only", "1")),
    # A decode step's parts (the weights' read, TNN's state and norms, the rest), the step compiled and with a narrow
    # head, on the scale ladder's models (41 minutes in the published run: 40 rounds, each timed call 16 steps); the
    # same at batch 8 after 256 tokens, 350M (12 minutes).
    Step("bench_decode_floor", "run_scripts/bench_decode_floor.py", ("--rungs", "6M,48.7M,125M,350M", "--rounds", "40",
                                                                     "--compiled", "1", "--narrow_head", "1"),
         ("--rungs", "tiny-32", "--context", "64", "--rounds", "2")),
    Step("bench_decode_floor_b8", "run_scripts/bench_decode_floor.py",
         ("--rungs", "350M", "--batch", "8", "--context", "256", "--rounds", "10"),
         ("--rungs", "tiny-32", "--batch", "2", "--context", "32", "--rounds", "1")),
    # What a small operator costs after a pause, without a model: the machine's share of the decode floor's excess
    # (a minute).
    Step("bench_pause_penalty", "run_scripts/bench_pause_penalty.py", ("--rounds", "1000"), ("--rounds", "2")),
    # Prefill against the plain forward and Llama, chunked against one shot (6M, 48.7M and 125M), 32,768 tokens (6M
    # and 48.7M; 43 minutes in the published run).
    Step("bench_prefill", "run_scripts/bench_prefill.py", ("--rungs", "6M,48.7M,125M"), ("--quick",)),
    Step("bench_compact_fit", "run_scripts/bench_compact_fit.py", ("--runs", "3"), ("--runs", "1")),
    Step("bench_fd_compression", "run_scripts/bench_fd_compression.py", (), ()),
    Step("bench_packing", "run_scripts/bench_packing.py", (), ("--rounds", "1", "--batch_size", "8", "--hidden_size",
                                                               "32", "--equal_length", "8")),
    Step("bench_token_mixers", "run_scripts/bench_token_mixers.py", ("--lengths", "2048,4096,8192,16384",
                                                                     "--batches", "1", "--rounds", "5"),
         ("--lengths", "256,512", "--batches", "1", "--channels", "32", "--rounds", "1")),
    Step("bench_token_mixers_direct", "run_scripts/bench_token_mixers.py",
         ("--direct", "--lengths", "16,32,64,96,128,192", "--channel_counts", "128,384,768", "--tokens", "8192",
          "--rounds", "5"),
         ("--direct", "--lengths", "16,32", "--channel_counts", "32", "--tokens", "256", "--rounds", "1")),
)
STEP_NAMES = tuple(step.folder for step in PLAN)


def run_plan(results_root: Path, quick: bool = False, only: tuple[str, ...] | None = None) -> list[dict]:
    """Run the plan's steps (``only``: those folders) from the source tree, each into a fresh
    ``results_root/<folder>``; returns each step's command, status and seconds. Stops at the first failure."""
    root = source_tree()
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(root), os.environ.get("PYTHONPATH", "")) if p))
    done = []
    for step in PLAN:
        if only is not None and step.folder not in only:
            continue
        folder = Path(results_root).resolve() / step.folder
        shutil.rmtree(folder, ignore_errors=True)  # regenerated, not merged with an older run's files
        # Relative to the source tree where it lies inside it: the command each table records then holds no machine path.
        output_dir = os.path.relpath(folder, root) if folder.is_relative_to(root) else str(folder)
        command = [sys.executable, step.script, *(step.quick if quick else step.full), "--output_dir", output_dir]
        start = CLOCK()
        status = subprocess.run(command, cwd=root, env=env).returncode
        done.append(dict(folder=step.folder, returncode=status, seconds=round(CLOCK() - start, 1)))
        print(f"== {step.folder}: {'ok' if status == 0 else f'FAILED ({status})'} in {done[-1]['seconds']:.0f} s",
              flush=True)
        if status:
            break
    return done


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--results_root", default="results", help="the folder the bench_* folders go into")
    parser.add_argument("--quick", action="store_true", help="toy sizes: checks that every benchmark runs")
    parser.add_argument("--only", default=None, help=f"comma list of folders from {', '.join(STEP_NAMES)}")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    only = None if args.only is None else tuple(args.only.split(","))
    unknown = [name for name in only or () if name not in STEP_NAMES]
    if unknown:
        raise ValueError(f"--only {unknown}: allowed values are {list(STEP_NAMES)}")
    done = run_plan(Path(args.results_root), args.quick, only)
    total = sum(step["seconds"] for step in done)
    print(f"{len(done)} benchmark(s) in {total / 60:.1f} min")
    return 0 if done and all(step["returncode"] == 0 for step in done) else 1
