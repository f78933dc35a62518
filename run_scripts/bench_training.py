#!/usr/bin/env python
"""Whole-model training step (forward + backward + AdamW step) of TNN against attention at matched size: throughput,
peak memory, profiles and aten operator counts. The benchmark is modeling_tnn.recipes.benchmarks.training (its
docstring and ``--help`` say what is measured and how).

    python run_scripts/bench_training.py --suite small_gpt --output_dir results/bench_training/small_gpt
    python run_scripts/bench_training.py --families causal --lengths 128,2048 --output_dir results/bench_training/causal
"""

from modeling_tnn.recipes.benchmarks.training import main

if __name__ == "__main__":
    main()
