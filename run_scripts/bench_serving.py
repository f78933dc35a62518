#!/usr/bin/env python
"""Serving throughput: TNN against a Llama of matched size in the same vLLM, and TNN in vLLM against transformers'
generate with a static batch (modeling_tnn.recipes.benchmarks.serving; needs `make vllm-install`).

    python run_scripts/bench_serving.py --output_dir results/bench_serving
"""

from modeling_tnn.recipes.benchmarks.serving import main

if __name__ == "__main__":
    raise SystemExit(main())
