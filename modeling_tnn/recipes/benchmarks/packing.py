"""What padding-free (packed) batches save: a training step (forward + backward) of the ``small`` preset as a masked
LM on a batch of SST-2 sentence lengths, padded to its longest sentence against packed into one row with
``position_ids`` restarting at each sentence (each mixed alone, ops_documents), and the same two layouts when every
sentence has one length (where packing must cost nothing: no padding to save).

    python run_scripts/bench_packing.py --output_dir results/bench_packing

Sentence lengths: SST-2's training sentences in whitespace words plus two special tokens, from
:data:`SST2_LENGTHS` (their histogram, counted from GLUE's SST-2 ``train.tsv``), or from that file itself with
``--sst2_tsv``. The padding fraction of the sampled batch is reported.
"""

from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path

import torch

from modeling_tnn import TnnForMaskedLM, load_preset

from .harness import CLOCK, command_line, interleaved, label_of, set_threads, timing_rows, workload, write_report

SCRIPT = "run_scripts/bench_packing.py"
NAMES = ("SST-2 lengths", "equal lengths")
# SST-2 train (67,349 sentences): sentences per length (whitespace words + 2 special tokens).
SST2_LENGTHS = {3: 4270, 4: 7241, 5: 7031, 6: 5511, 7: 4578, 8: 4019, 9: 3594, 10: 3092, 11: 2861, 12: 2564,
                13: 2230, 14: 2051, 15: 1830, 16: 1748, 17: 1560, 18: 1388, 19: 1265, 20: 1182, 21: 1040, 22: 922,
                23: 860, 24: 820, 25: 741, 26: 654, 27: 572, 28: 505, 29: 460, 30: 416, 31: 335, 32: 297, 33: 281,
                34: 253, 35: 226, 36: 166, 37: 152, 38: 108, 39: 90, 40: 91, 41: 60, 42: 55, 43: 53, 44: 34, 45: 30,
                46: 24, 47: 27, 48: 17, 49: 9, 50: 11, 51: 9, 52: 7, 53: 6, 54: 3}


def sst2_lengths(tsv: str | None = None) -> tuple[list[int], str]:
    """Every SST-2 training sentence's length and where it came from: the ``tsv`` file (GLUE's SST-2 train.tsv)
    when given, else the embedded histogram."""
    if tsv is not None:
        rows = Path(tsv).read_text().splitlines()[1:]
        return [len(row.split("\t")[0].split()) + 2 for row in rows if row], "SST-2 train.tsv"
    return [n for n, count in SST2_LENGTHS.items() for _ in range(count)], "the SST-2 length histogram"


def sample_batch(lengths: list[int], batch_size: int, seed: int) -> list[int]:
    """``batch_size`` sentence lengths drawn without replacement (seeded)."""
    return random.Random(seed).sample(lengths, batch_size)


def layouts(lengths: list[int], vocab_size: int) -> dict[str, dict[str, torch.Tensor]]:
    """The padded and the packed inputs (with masked-LM labels on every real token) of documents of ``lengths``."""
    generator = torch.Generator().manual_seed(0)
    docs = [torch.randint(5, vocab_size, (n,), generator=generator) for n in lengths]
    width = max(lengths)
    ids = torch.zeros(len(docs), width, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for row, doc in enumerate(docs):
        ids[row, :len(doc)], mask[row, :len(doc)] = doc, 1
    packed_ids = torch.cat(docs)[None]
    positions = torch.cat([torch.arange(len(doc)) for doc in docs])[None]
    return {"padded": dict(input_ids=ids, attention_mask=mask, labels=ids.masked_fill(mask == 0, -100)),
            "packed": dict(input_ids=packed_ids, position_ids=positions, labels=packed_ids)}


def step_of(model: torch.nn.Module, inputs: dict[str, torch.Tensor]):
    """One forward + backward of ``model`` on ``inputs`` (gradients dropped after each)."""
    def step() -> None:
        model.zero_grad(set_to_none=True)
        model(**inputs).loss.backward()
    return step


def measure(args: argparse.Namespace) -> tuple[dict, dict]:
    """The timings of the four variants and what they ran on."""
    all_lengths, source = sst2_lengths(args.sst2_tsv)
    batch = sample_batch(all_lengths, args.batch_size, args.seed)
    equal = [args.equal_length] * args.batch_size
    overrides = {} if args.hidden_size is None else {"hidden_size": args.hidden_size}
    torch.manual_seed(0)
    model = TnnForMaskedLM(load_preset("small", token_mixer=args.token_mixer, dropout=0.0, **overrides)).train()
    work = {}
    for name, lengths in zip(NAMES, (batch, equal)):
        for layout, inputs in layouts(lengths, model.config.vocab_size).items():
            work[(name, layout)] = workload(step_of(model, inputs))
    timings = interleaved(work, rounds=args.rounds, warmup=1, rotate=True, progress="packing")
    padding = 1 - sum(batch) / (len(batch) * max(batch))
    info = dict(source=source, lengths=batch, padding_fraction=round(padding, 3), longest=max(batch),
                tokens=sum(batch), equal_length=args.equal_length)
    rows = timing_rows(timings)
    for name in NAMES:
        info[f"speedup {name}"] = round(timings[(name, "padded")].median / timings[(name, "packed")].median, 3)
    return dict(info=info, timings=rows), timings


def render(result: dict, args: argparse.Namespace) -> str:
    info, rows = result["info"], result["timings"]
    lines = [f"`small` preset masked LM ({args.token_mixer}), one thread, forward + backward, median of "
             f"{args.rounds} interleaved rounds. Batch of {args.batch_size} sentences from {info['source']}: "
             f"{info['tokens']} tokens, longest {info['longest']}, padding fraction {info['padding_fraction']:.2f} "
             f"of the padded batch.", "",
             "| lengths | layout | median (ms) | padded / packed |", "|---|---|---|---|"]
    spread = max(row["spread"] for row in rows.values())
    for name in NAMES:
        for layout in ("padded", "packed"):
            speedup = f"{info[f'speedup {name}']:.2f}x" if layout == "packed" else ""
            lines.append(f"| {name} | {layout} | {rows[label_of((name, layout))]['median_s'] * 1e3:.1f} | {speedup} |")
    lines += ["", f"Largest relative interquartile spread over the rounds: {spread:.0%}."]
    return "\n".join(lines)


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--output_dir", default="results/bench_packing")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--batch_size", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0, help="which batch of sentences is drawn")
    parser.add_argument("--sst2_tsv", default=None, help="GLUE's SST-2 train.tsv to read the lengths from (default: "
                                                         "the embedded histogram of the same file)")
    parser.add_argument("--equal_length", type=int, default=24, help="length of every sentence of the equal batch")
    parser.add_argument("--token_mixer", default="dense", choices=("dense", "fd", "ski"))
    parser.add_argument("--hidden_size", type=int, default=None, help="override the preset's (toy runs)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse_args(argv)
    started = CLOCK()
    set_threads(1)
    result, timings = measure(args)
    table = render(result, args)
    print(table)
    write_report(Path(args.output_dir), "Padding-free (packed) batches", command_line(SCRIPT, argv), vars(args),
                 result, table, figure="packing.png", timings=timings, started=started)


if __name__ == "__main__":
    main()
