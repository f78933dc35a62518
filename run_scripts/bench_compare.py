#!/usr/bin/env python
"""A/B of two commits on one or more named benchmarks, rounds interleaved between them
(modeling_tnn.recipes.benchmarks.compare; ``--list`` names the benchmarks).

    python run_scripts/bench_compare.py --base 797cb14 --head HEAD --output_dir results/ab
"""

from modeling_tnn.recipes.benchmarks.compare import main

if __name__ == "__main__":
    main()
