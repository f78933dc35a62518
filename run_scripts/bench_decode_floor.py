#!/usr/bin/env python
"""What a decode step is made of, TNN against the scale ladder's Llama: the step, its matrix products alone, TNN's
decoding state (modeling_tnn.recipes.benchmarks.decode_floor).

    python run_scripts/bench_decode_floor.py --output_dir results/bench_decode_floor
"""

from modeling_tnn.recipes.benchmarks.decode_floor import main

if __name__ == "__main__":
    raise SystemExit(main())
