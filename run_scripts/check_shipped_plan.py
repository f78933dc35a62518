#!/usr/bin/env python
"""The decoding plan shipped with a checkpoint, end to end: fit and save, then in a fresh process load, the first
cached forward without a fit, decoding against the no-cache forward, and a refit after a weight is changed
(modeling_tnn.recipes.benchmarks.shipped_plan).

    python run_scripts/check_shipped_plan.py --output_dir results/shipped_plan
"""

from modeling_tnn.recipes.benchmarks.shipped_plan import main

if __name__ == "__main__":
    raise SystemExit(main())
