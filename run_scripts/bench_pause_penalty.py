#!/usr/bin/env python
"""What a small operator costs on this machine right after another and after a pause, without a model
(modeling_tnn.recipes.benchmarks.pause_penalty).

    python run_scripts/bench_pause_penalty.py --output_dir results/bench_pause_penalty
"""

from modeling_tnn.recipes.benchmarks.pause_penalty import main

if __name__ == "__main__":
    raise SystemExit(main())
