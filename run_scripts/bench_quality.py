#!/usr/bin/env python
"""Quality comparison: TNN (dense and fd) against GPT-2 at matched parameter count, trained through train_clm's code
path and evaluated at 1x to 8x the training length (modeling_tnn.recipes.benchmarks.quality).

    python run_scripts/bench_quality.py                       # results/quality (about 25 minutes on 2 CPU cores)
    python run_scripts/bench_quality.py --steps 20 --datasets tinyshakespeare   # a smoke run
"""

from modeling_tnn.recipes.benchmarks.quality import main

if __name__ == "__main__":
    main()
