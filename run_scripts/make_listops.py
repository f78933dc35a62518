#!/usr/bin/env python
"""Generate the Long Range Arena ListOps task from its definition and check what was written.

    python run_scripts/make_listops.py --output_dir data/listops            # LRA's 96,000 / 2,000 / 2,000 rows
    python run_scripts/make_listops.py --output_dir data/listops_small --num_train 2000

Writes ``basic_train.tsv``, ``basic_val.tsv`` and ``basic_test.tsv`` (header ``Source<TAB>Target``), then reads
them back and checks every row: length in (500, 2000) tokens as LRA counts them (operators, digits and ``]``), the
label equal to the evaluated expression, no expression twice across the splits. A failed check raises an error
naming the split and row. The same ``--seed`` gives the same files.
"""

from __future__ import annotations

import argparse
import time

from modeling_tnn.recipes.listops.data import DEFAULT_COUNTS, MAX_LENGTH, MIN_LENGTH, make_listops


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--output_dir", required=True, help="folder for basic_{train,val,test}.tsv")
    parser.add_argument("--num_train", type=int, default=DEFAULT_COUNTS["train"])
    parser.add_argument("--num_val", type=int, default=DEFAULT_COUNTS["val"])
    parser.add_argument("--num_test", type=int, default=DEFAULT_COUNTS["test"])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--min_length", type=int, default=MIN_LENGTH,
                        help="keep expressions longer than this (LRA: 500; lower it only for quick tests)")
    parser.add_argument("--max_length", type=int, default=MAX_LENGTH,
                        help="keep expressions shorter than this (LRA: 2000)")
    parser.add_argument("--no_progress", action="store_true", help="hide the progress bar")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    start = time.perf_counter()
    report = make_listops(args.output_dir, args.num_train, args.num_val, args.num_test, args.seed,
                          args.min_length, args.max_length, progress=not args.no_progress)
    print(f"wrote {report.counts} to {args.output_dir} in {time.perf_counter() - start:.1f} s; checked: lengths "
          f"{report.min_seen}..{report.max_seen} in ({args.min_length}, {args.max_length}), labels equal the "
          f"evaluated expressions, no duplicates across splits")


if __name__ == "__main__":
    main()
