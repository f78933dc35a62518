"""Serving throughput (docs/serving.md#throughput): a causal TNN against a Llama of matched parameter count in the same
vLLM on this CPU, and TNN in vLLM against TNN in transformers' ``generate`` with a static batch.

Both models are the scale ladder's smallest rung at a 2,048-token vocabulary (``small`` at width 256, 4 layers,
against a Llama of 256 x 4, heads of 64, the MLP width that matches the parameter count, tied embeddings), at their
initial weights (speed does not depend on them; every request generates all its tokens). The TNN ships its decoding
plan. The vLLM side (:mod:`~modeling_tnn.serving.bench_engine`) runs in vLLM's venv (``make vllm-install``), where
the recipes cannot be imported; this module builds the folders, times ``generate`` and writes
``results/bench_serving``. Not a step of ``make bench``: it needs vLLM's venv and about 20 minutes. Output tokens per second count every generated token over
the wall time from submitting the requests to the last token, prefill included.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

import torch

from .harness import CLOCK, command_line, set_threads, time_once, write_report
from .scale_ladder import build_pair
from .scale_ladder_rungs import Rung

VLLM_PYTHON = Path(".venv-vllm") / "bin" / "python"
RUNG = Rung("6M", "small", dict(hidden_size=256, num_hidden_layers=4, vocab_size=2048), tokens=2048)
TARGETS = {"16x2048": 1.2, "16x8192": 1.5}  # TNN's output tokens/s over Llama's the issue asks for
CAPACITY_TARGET = 5.0


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--output_dir", default="results/bench_serving")
    parser.add_argument("--cells", default="1x256,16x256,1x2048,16x2048,64x2048,16x8192",
                        help="concurrency x prompt tokens, comma-separated (e.g. 16x8192,64x2048)")
    parser.add_argument("--new_tokens", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--static_cell", default="16x2048", help="the cell TNN's generate runs with a static batch")
    parser.add_argument("--kv_budget_gib", type=float, default=2.0, help="VLLM_CPU_KVCACHE_SPACE of both engines")
    parser.add_argument("--work_dir", default="outputs/bench_serving", help="where the two model folders are saved")
    args = parser.parse_args(argv)
    args.cells = [tuple(int(x) for x in cell.split("x")) for cell in args.cells.split(",") if cell.strip()]
    args.static_cell = tuple(int(x) for x in args.static_cell.split("x"))
    if args.new_tokens < 1 or args.repeats < 1 or any(c < 1 or n < 1 for c, n in args.cells):
        raise ValueError("--new_tokens, --repeats and every cell's concurrency and length must be at least 1.")
    return args


def build_folders(root: Path) -> tuple[dict[str, str], torch.nn.Module, dict[str, int]]:
    """The rung's TNN (its plan fitted) and Llama saved under ``root``; the TNN model; both parameter counts."""
    tnn, llama = build_pair(RUNG, seed=0)
    tnn.fit_decoding_plan()
    folders = {"TNN": root / "tnn", "Llama": root / "llama"}
    tnn.save_pretrained(folders["TNN"])
    llama.save_pretrained(folders["Llama"])
    counts = {name: sum(p.numel() for p in model.parameters()) for name, model in (("TNN", tnn), ("Llama", llama))}
    return {name: str(path.resolve()) for name, path in folders.items()}, tnn, counts


def run_engines(folders: dict[str, str], args, prompts: list[list[int]], work: Path) -> dict:
    spec = dict(folders=folders, cells=args.cells, new_tokens=args.new_tokens, repeats=args.repeats,
                capacity_context=2048, prompts=prompts)
    (work / "spec.json").write_text(json.dumps(spec))
    env = {"VLLM_CPU_KVCACHE_SPACE": f"{args.kv_budget_gib:g}", "HF_HUB_OFFLINE": "1"}
    # absolute(), not resolve(): the venv's python is a link to the base interpreter, which has no vLLM
    subprocess.run([str(VLLM_PYTHON.absolute()), "-m", "modeling_tnn.serving.bench_engine", str(work / "spec.json"),
                    str(work / "engine.json")], check=True, env={**os.environ, **env})
    return json.loads((work / "engine.json").read_text())


def time_generate(model: torch.nn.Module, prompts: list[list[int]], cell: tuple[int, int], new_tokens: int) -> float:
    """Seconds of one ``generate`` of the cell's requests as one static batch (one thread, as vLLM's worker)."""
    concurrency, length = cell
    ids = torch.tensor([p[:length] for p in prompts[:concurrency]])
    with torch.no_grad():
        return time_once(lambda: model.generate(ids, max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                                                do_sample=False))[1]


def table(engine: dict, static: dict, counts: dict[str, int], args) -> str:
    lines = [f"TNN {counts['TNN']:,} parameters, Llama {counts['Llama']:,}; {args.new_tokens} tokens generated per "
             f"request, median of {args.repeats} interleaved runs; output tokens/s include the prefill.", "",
             "| concurrency x prompt | TNN tokens/s | Llama tokens/s | TNN / Llama | target | TNN first token (s) | "
             "Llama first token (s) |", "|---|---|---|---|---|---|---|"]
    for concurrency, length in args.cells:
        key = f"{concurrency}x{length}"
        rate = {name: engine[name]["cells"][key]["output_tokens"] / statistics.median(engine[name]["cells"][key]
                                                                                      ["seconds"]) for name in engine}
        ttft = {name: [t for t in engine[name]["cells"][key]["ttft"] if t is not None] for name in engine}
        first = {name: f"{statistics.median(v):.2f}" if v else "n/a" for name, v in ttft.items()}
        ratio = rate["TNN"] / rate["Llama"]
        target = f">= {TARGETS[key]}x: {'met' if ratio >= TARGETS[key] else 'missed'}" if key in TARGETS else ""
        lines.append(f"| {key} | {rate['TNN']:.0f} | {rate['Llama']:.0f} | {ratio:.2f}x | {target} | {first['TNN']} "
                     f"| {first['Llama']} |")
    capacity = {name: engine[name]["capacity"] for name in engine}
    if all(capacity.values()):
        ratio = capacity["TNN"] / capacity["Llama"]
        lines += ["", f"Requests of 2,048 tokens held in the same {args.kv_budget_gib:g} GiB budget: TNN "
                      f"{capacity['TNN']:,}, Llama {capacity['Llama']:,} ({ratio:.1f}x; target >= "
                      f"{CAPACITY_TARGET:g}x: {'met' if ratio >= CAPACITY_TARGET else 'missed'})."]
    key = "x".join(map(str, args.static_cell))
    if key in engine["TNN"]["cells"]:
        served = engine["TNN"]["cells"][key]["output_tokens"] / statistics.median(engine["TNN"]["cells"][key]
                                                                                  ["seconds"])
        lines += ["", f"TNN at {key}: {served:.0f} tokens/s in vLLM, {static['tokens_per_s']:.0f} tokens/s in "
                      f"transformers' generate with one static batch ({served / static['tokens_per_s']:.2f}x)."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    started = CLOCK()
    work = Path(args.work_dir)
    work.mkdir(parents=True, exist_ok=True)
    folders, tnn, counts = build_folders(work)
    longest = max(max(n for _, n in args.cells), args.static_cell[1])
    generator = torch.Generator().manual_seed(0)
    prompts = torch.randint(1, RUNG.overrides["vocab_size"], (max(max(c for c, _ in args.cells),
                                                                   args.static_cell[0]), longest),
                            generator=generator).tolist()
    engine = run_engines(folders, args, prompts, work)
    set_threads(1)
    seconds = statistics.median(time_generate(tnn.eval(), prompts, args.static_cell, args.new_tokens)
                                for _ in range(args.repeats))
    static = dict(cell=args.static_cell, seconds=seconds, tokens_per_s=args.static_cell[0] * args.new_tokens / seconds)
    write_report(args.output_dir, "bench_serving", command_line("run_scripts/bench_serving.py", argv),
                 vars(args), dict(engine=engine, static_generate=static, parameters=counts),
                 table(engine, static, counts, args), plot=lambda path: None, started=started)
    print((Path(args.output_dir) / "table.md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
