#!/usr/bin/env python
"""The GLUE comparison recipe (``make glue``): pretrain a small TNN and a BERT of matched size with the same
masked-LM recipe, finetune both on every GLUE task available locally, and write the tables under ``--results_dir``.
The steps and their sizes: ``--help``, or modeling_tnn/recipes/glue/comparison.py.

    python run_scripts/glue_recipe.py --results_dir results/glue
    python run_scripts/glue_recipe.py --text embedded --tasks rte,mrpc --skip_existing
"""

from modeling_tnn.recipes.glue.comparison import main

if __name__ == "__main__":
    main()
