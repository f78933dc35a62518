#!/usr/bin/env python
"""Regenerate every results/bench_* folder (``make bench``); ``--quick``: toy sizes into another folder
(modeling_tnn.recipes.benchmarks.plan says what runs and how long it takes).

    python run_scripts/bench_all.py
    python run_scripts/bench_all.py --quick --results_root outputs/bench_quick
"""

from modeling_tnn.recipes.benchmarks.plan import main

if __name__ == "__main__":
    raise SystemExit(main())
