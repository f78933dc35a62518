#!/usr/bin/env python
"""Generation with the TNN cache against attention's KV cache: per-token decode latency, state memory, prefill, the
streamer clock of generate and the cached decoder's error; ``--profile_only 1``: one decode step under the profiler.
The benchmark is modeling_tnn.recipes.benchmarks.generation (``--help`` says what is measured and how).

    python run_scripts/bench_generation.py --output_dir results/bench_generation
"""

from modeling_tnn.recipes.benchmarks.generation import main

if __name__ == "__main__":
    main()
