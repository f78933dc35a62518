#!/usr/bin/env python
"""The one command to run the day an accelerator is there: the device-sensitive tests on that device, a short
training and generation benchmark sweep, and one JSON summary (modeling_tnn.recipes.benchmarks.accelerator_check).

    python run_scripts/accelerator_check.py --output_dir results/accelerator_check_cuda        # --device cuda
    python run_scripts/accelerator_check.py --device cpu --quick --output_dir outputs/check    # the dry run
"""

from modeling_tnn.recipes.benchmarks.accelerator_check import main

if __name__ == "__main__":
    raise SystemExit(main())
