#!/usr/bin/env python
"""Time of the compact decoding state's fit and the plan it gives (modeling_tnn.recipes.benchmarks.compact_fit).

    python run_scripts/bench_compact_fit.py --output_dir results/bench_compact_fit
"""

from modeling_tnn.recipes.benchmarks.compact_fit import main

if __name__ == "__main__":
    main()
