#!/usr/bin/env python
"""The scale ladder (``make bench-ladder``): TNN at 6M, 48.7M, 125M and 350M parameters against Llama of matched
size: training step, decode ms/token, prefill, state bytes, compact fit, peak memory and the targets of issue 29.
The benchmark is modeling_tnn.recipes.benchmarks.scale_ladder (``--help`` says what is measured and how).

    python run_scripts/bench_scale_ladder.py --output_dir results/bench_scale_ladder
"""

from modeling_tnn.recipes.benchmarks.scale_ladder import main

if __name__ == "__main__":
    main()
