#!/usr/bin/env python
"""Prefill at the forward's cost (issue 38): TNN's forward that returns the decoding state against its plain forward
and the matched Llama's prefill, a long prompt in chunks against one shot, 32,768 tokens with peak memory
(modeling_tnn.recipes.benchmarks.prefill).

    python run_scripts/bench_prefill.py --output_dir results/bench_prefill
"""

from modeling_tnn.recipes.benchmarks.prefill import main

if __name__ == "__main__":
    raise SystemExit(main())
