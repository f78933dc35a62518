#!/usr/bin/env python
"""Whether FD kernels compress like decaying dense ones (modeling_tnn.recipes.benchmarks.fd_compression).

    python run_scripts/bench_fd_compression.py --output_dir results/bench_fd_compression
"""

from modeling_tnn.recipes.benchmarks.fd_compression import main

if __name__ == "__main__":
    main()
