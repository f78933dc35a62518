#!/usr/bin/env python
"""Collect ListOps runs of run_scripts/train_listops.py into one table, JSON and learning-curve plot.

    python run_scripts/summarize_listops.py --output_dir results/listops --data_dir data/listops \\
        runs/listops_dense runs/listops_bert ...

Writes ``listops_results.md`` (test accuracy, best validation accuracy, steps, batch, wall time and machine load per
run; with ``--data_dir`` a majority-class row), ``listops_results.json`` (each run's ``all_results.json`` and
curves) and ``learning_curves.png``.
"""

from __future__ import annotations

import argparse

from modeling_tnn.recipes.listops.training import summarize_runs


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dirs", nargs="+", help="output folders of train_listops.py")
    parser.add_argument("--output_dir", required=True, help="where the table, JSON and PNG go")
    parser.add_argument("--data_dir", default=None, help="the runs' data folder: adds the majority-class accuracy")
    args = parser.parse_args(argv)
    print(summarize_runs(args.run_dirs, args.output_dir, args.data_dir)["table"])


if __name__ == "__main__":
    main()
