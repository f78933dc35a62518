#!/usr/bin/env python
"""Forward + backward time of the dense, FD and SKI token mixers, alone and inside one TNN block; ``--direct``: the
direct Toeplitz product against the FFT at short lengths (modeling_tnn.recipes.benchmarks.token_mixers).

    python run_scripts/bench_token_mixers.py --output_dir results/bench_token_mixers
    python run_scripts/bench_token_mixers.py --direct --output_dir results/bench_token_mixers_direct
"""

from modeling_tnn.recipes.benchmarks.token_mixers import main

if __name__ == "__main__":
    main()
