"""The GLUE comparison recipe (``make glue``, ``run_scripts/glue_recipe.py``): pretrain a small bidirectional TNN and a
BERT of matched size with the same masked-LM recipe (``train_mlm.py``), finetune both on every GLUE task available
locally (the suite, :mod:`.suite`), and write the tables under ``--results_dir``.

Steps, all under ``--work_dir`` (ignored by git) except the result tables:

1. the pretraining text: WikiText-2's valid + test text (``$TNN_DATA_DIR/wikitext-2``; its train split is not
   available here) when present, else the embedded corpus (CPython's ``pydoc_data.topics``);
2. one byte-level BPE tokenizer for both models, with a RoBERTa-style pair template (``<s> A </s></s> B </s>``) so
   that sentence-pair tasks see a separator;
3. ``train_mlm.py`` twice: the ``small`` TNN preset and a ``BertForMaskedLM`` config of the same width, depth and
   parameter count; both run at once with ``--jobs 2``;
4. the GLUE suite over both checkpoints with the same finetuning arguments.

Sized for 2 CPU cores shared with other work (about 35 minutes in all with the defaults when other processes
take about half of the cores): 120 MLM steps of 16 x 128 tokens, then 1 epoch on at most 2,000 training rows per task
(a seeded random subset) with inputs cut to 64 tokens, evaluation on the full dev sets. These are tiny budgets: the
numbers compare two architectures under the same small recipe, they are far from published GLUE scores. Every step
can be resumed with ``--skip_existing``.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from ..common.data_location import PROJECT_ROOT, find_data_dir
from .suite import default_glue_dir, run_one
from .suite import main as run_suite

TRAIN_MLM = PROJECT_ROOT / "run_scripts" / "train_mlm.py"
SCRIPT = "run_scripts/glue_recipe.py"
# BERT sized like the `small` TNN preset (width 128, 4 layers): intermediate 768 gives 1,056,256 parameters in the
# 4 layers (TNN small: 1,052,800 with its RPEs); with a 4,096-token vocabulary the MLMs have 1,618,176 (BERT, which
# also has 16k position embeddings) and 1,598,208 (TNN) parameters.
BERT_CONFIG = {"model_type": "bert", "hidden_size": 128, "num_hidden_layers": 4, "num_attention_heads": 2,
               "intermediate_size": 768, "max_position_embeddings": 128, "type_vocab_size": 1,
               "hidden_dropout_prob": 0.1, "attention_probs_dropout_prob": 0.1}


def relative(path: Path) -> str:
    """``path`` relative to the project root when possible, so that the recorded commands name no machine paths."""
    try:
        return os.path.relpath(path, PROJECT_ROOT)
    except ValueError:
        return str(path)


def write_pretraining_text(source: str, work_dir: Path) -> tuple[Path, str]:
    """The pretraining text file and a sentence saying what it is."""
    target = work_dir / "pretraining_text.txt"
    folder = find_data_dir()
    if source == "wikitext2":
        if folder is None or not (folder / "wikitext-2" / "valid.txt").is_file():
            raise FileNotFoundError("WikiText-2 not found: set TNN_DATA_DIR (with wikitext-2/valid.txt and test.txt) "
                                    "or use --text embedded.")
        parts = [(folder / "wikitext-2" / name).read_text(encoding="utf-8") for name in ("valid.txt", "test.txt")]
        what = "WikiText-2 (tokenised version) valid + test text, 5% of its lines held out for MLM validation"
    else:
        from ..pretraining.corpus import embedded_corpus

        parts = ["\n\n".join(embedded_corpus())]
        what = "the embedded corpus (CPython's pydoc_data.topics), 5% of its lines held out for MLM validation"
    work_dir.mkdir(parents=True, exist_ok=True)
    target.write_text("\n".join(parts), encoding="utf-8")
    return target, what


def train_tokenizer(text_file: Path, vocab_size: int, folder: Path) -> None:
    """A byte-level BPE with ``<s> A </s></s> B </s>`` pairs, trained on the pretraining text."""
    from ..pretraining.tokenizer import train_byte_level_bpe

    lines = [line for line in text_file.read_text(encoding="utf-8").splitlines() if line.strip()]
    train_byte_level_bpe(lines, vocab_size=vocab_size, add_bos_eos=True).save_pretrained(folder)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The recipe's flags; ``--text`` defaults to WikiText-2 where the shared data holds it, else the embedded text."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--text", choices=["wikitext2", "embedded"], default=None,
                        help="pretraining text (default: wikitext2 when the shared data is present, else embedded)")
    parser.add_argument("--glue_dir", default=default_glue_dir())
    parser.add_argument("--work_dir", default="outputs/glue_recipe", help="tokenizer, checkpoints, logs")
    parser.add_argument("--results_dir", default="results/glue", help="the small result files (JSON + markdown)")
    parser.add_argument("--tasks", default=None, help="comma-separated GLUE tasks (default: all available locally)")
    parser.add_argument("--vocab_size", type=int, default=4096)
    parser.add_argument("--pretrain_steps", type=int, default=120)
    parser.add_argument("--pretrain_batch_size", type=int, default=16)
    parser.add_argument("--pretrain_learning_rate", type=float, default=1e-3)
    parser.add_argument("--block_size", type=int, default=128)
    parser.add_argument("--learning_rate", type=float, default=5e-4, help="finetuning learning rate")
    parser.add_argument("--num_train_epochs", type=float, default=1)
    parser.add_argument("--train_batch_size", type=int, default=16, help="finetuning batch size")
    parser.add_argument("--max_seq_length", type=int, default=64)
    parser.add_argument("--max_train_samples", type=int, default=2000,
                        help="training rows kept per task, a seeded random subset where a task has more (CoLA 8,551, "
                             "SST-2 67,349, STS-B 5,749)")
    parser.add_argument("--jobs", type=int, default=2, help="processes at a time (pretraining and finetuning)")
    parser.add_argument("--threads", type=int, default=1, help="OMP_NUM_THREADS of each process")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--skip_existing", action="store_true", help="reuse finished steps of an earlier run")
    args = parser.parse_args(argv)
    if args.text is None:
        data = find_data_dir()
        args.text = "wikitext2" if data and (data / "wikitext-2").is_dir() else "embedded"
    return args


def pretraining_command(args: argparse.Namespace, config: str, text_file: Path, tokenizer_dir: Path,
                        output_dir: Path) -> list[str]:
    """``train_mlm.py`` with the recipe's masked-LM arguments for one model (``config``: a preset or a config file);
    paths relative to the project root, where it runs. A rerun starts over (``--overwrite_output_dir``)."""
    return [sys.executable, str(TRAIN_MLM), "--train_file", relative(text_file),
            "--validation_split_percentage", "5", "--tokenizer_name", relative(tokenizer_dir),
            "--config_name", config, "--block_size", str(args.block_size),
            "--per_device_train_batch_size", str(args.pretrain_batch_size), "--per_device_eval_batch_size",
            "32", "--max_train_steps", str(args.pretrain_steps), "--learning_rate",
            str(args.pretrain_learning_rate), "--num_warmup_steps", str(args.pretrain_steps // 10),
            "--weight_decay", "0.01", "--seed", str(args.seed), "--report_to", "none", "--output_dir",
            relative(output_dir), "--overwrite_output_dir"]


def pretrain(args: argparse.Namespace, commands: dict[str, list[str]], env: dict[str, str]) -> dict[str, dict]:
    """Run the models' pretraining commands (``--jobs`` at a time); per model its command as recorded, wall time and
    ``all_results.json``."""
    work_dir = Path(args.work_dir)

    def run(name: str) -> float:
        out = work_dir / f"mlm_{name}"
        if args.skip_existing and (out / "all_results.json").is_file():
            return float("nan")
        out.mkdir(parents=True, exist_ok=True)
        print(f"[{time.strftime('%H:%M:%S')}] pretraining {name}", flush=True)
        return run_one(commands[name], work_dir / f"mlm_{name}.log", env, cwd=PROJECT_ROOT)

    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        seconds = dict(zip(commands, pool.map(run, commands)))
    pretraining = {}
    for name, command in commands.items():
        results = json.loads((work_dir / f"mlm_{name}" / "all_results.json").read_text())
        pretraining[name] = {"command": shlex.join(["python", relative(Path(command[1])), *command[2:]]),
                             "wall_seconds": round(seconds[name], 1), **results}
        print(f"  {name}: {results['num_parameters']:,} parameters, MLM validation perplexity "
              f"{results['perplexity']:.1f} ({seconds[name]:.0f} s)", flush=True)
    return pretraining


def suite_arguments(args: argparse.Namespace, checkpoints: dict[str, Path]) -> list[str]:
    """The suite's command line: every checkpoint on the chosen tasks, the same finetuning arguments for each."""
    suite_args = [arg for name, folder in checkpoints.items() for arg in ("--model", f"{name}={relative(folder)}")]
    suite_args += ["--glue_dir", args.glue_dir, "--output_dir", relative(Path(args.work_dir) / "glue"),
                   "--results_dir", str(Path(args.results_dir)), "--jobs", str(args.jobs), "--threads", str(args.threads)]
    if args.tasks:
        suite_args += ["--tasks", args.tasks]
    if args.skip_existing:
        suite_args.append("--skip_existing")
    return suite_args + [
        "--", "--learning_rate", str(args.learning_rate), "--num_train_epochs", str(args.num_train_epochs),
        "--max_seq_length", str(args.max_seq_length), "--max_train_samples", str(args.max_train_samples),
        "--train_subsample_seed", str(args.seed), "--per_device_train_batch_size", str(args.train_batch_size),
        "--per_device_eval_batch_size", "128", "--warmup_steps", "0.1", "--weight_decay", "0.01",
        "--seed", str(args.seed), "--save_strategy", "no", "--eval_strategy", "no", "--report_to", "none",
        "--disable_tqdm", "true"]


def pretraining_table(args: argparse.Namespace, pretraining: dict[str, dict]) -> str:
    """The markdown table of the pretrained models: parameters, steps x tokens, perplexity, wall time."""
    lines = ["| model | parameters | MLM steps x tokens | MLM validation perplexity | pretraining wall time |",
             "|---|---|---|---|---|"]
    for name, item in pretraining.items():
        lines.append(f"| {name} | {item['num_parameters']:,} | {item['train_steps']} x "
                     f"{args.pretrain_batch_size * args.block_size:,} | {item['perplexity']:.1f} | "
                     f"{item['wall_seconds']:.0f} s |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    """Run the recipe's four steps; write ``pretraining.json`` and ``pretraining.md`` beside the suite's tables."""
    args = parse_args(argv)
    work_dir, results_dir = Path(args.work_dir), Path(args.results_dir)
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads))
    start = time.time()

    # 1-2. text and tokenizer
    text_file, text_what = write_pretraining_text(args.text, work_dir)
    tokenizer_dir = work_dir / "tokenizer"
    if not (args.skip_existing and (tokenizer_dir / "tokenizer.json").is_file()):
        train_tokenizer(text_file, args.vocab_size, tokenizer_dir)
    bert_config = work_dir / "bert_config.json"
    bert_config.write_text(json.dumps(BERT_CONFIG, indent=2) + "\n")

    # 3. masked-LM pretraining of both models with the same arguments
    configs = {"tnn": "small", "bert": relative(bert_config)}
    checkpoints = {name: work_dir / f"mlm_{name}" for name in configs}
    pretraining = pretrain(args, {name: pretraining_command(args, config, text_file, tokenizer_dir, checkpoints[name])
                                  for name, config in configs.items()}, env)

    # 4. finetuning on every available task, same arguments for both models
    suite_args = suite_arguments(args, checkpoints)
    run_suite(suite_args)

    summary = {"pretraining_text": text_what, "tokenizer": f"byte-level BPE, {args.vocab_size} tokens, trained on "
               "the pretraining text", "bert_config": BERT_CONFIG, "pretraining": pretraining,
               "suite_command": shlex.join(["python", "run_scripts/run_glue_suite.py", *suite_args]),
               "recipe_command": shlex.join(["python", SCRIPT, *(sys.argv[1:] if argv is None else argv)]),
               "total_wall_seconds": round(time.time() - start, 1)}
    (results_dir / "pretraining.json").write_text(json.dumps(summary, indent=2) + "\n")
    table = pretraining_table(args, pretraining)
    (results_dir / "pretraining.md").write_text(f"Pretraining text: {text_what}.\n\n" + table + "\n")
    print(table)
    print(f"total wall time {time.time() - start:.0f} s; wrote {results_dir}/pretraining.json and pretraining.md")
