#!/usr/bin/env python
"""What padding-free (packed) batches save in a training step (modeling_tnn.recipes.benchmarks.packing).

    python run_scripts/bench_packing.py --output_dir results/bench_packing
"""

from modeling_tnn.recipes.benchmarks.packing import main

if __name__ == "__main__":
    main()
