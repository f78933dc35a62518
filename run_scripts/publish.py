#!/usr/bin/env python
"""Publish a TNN training output to the Hugging Face Hub: build a Hub-ready folder (config with the
``auto_map``, model code, ``model.safetensors``, tokenizer, ``generation_config.json`` for causal models, plots and a
``README.md`` model card whose ``model-index`` is read from the run's results file), then upload it with one
``HfApi().upload_folder`` call, creating the repository when needed.

Examples::

    # see what would be uploaded (nothing leaves the machine)
    python run_scripts/publish.py outputs/demo --repo_id me/tnn-small-demo --dry-run \\
        --dataset_name "CPython pydoc topics"
    # upload (the token comes from `hf auth login` or HF_TOKEN)
    python run_scripts/publish.py outputs/glue_recipe/glue/tnn/rte --repo_id me/tnn-small-rte --private
    # a language model trained on a Hub dataset, as a pull request on an existing repository
    python run_scripts/publish.py outputs/wt103 --repo_id me/tnn-wt103 --dataset Salesforce/wikitext \\
        --dataset_config wikitext-103-raw-v1 --dataset_split validation --create_pr

GLUE runs (``finetune_glue.py`` output) name their dataset themselves (``nyu-mll/glue`` and the task config);
language-model runs need ``--dataset`` and/or ``--dataset_name``. ``--card_dir model_cards/NAME`` also copies the
card and its plots (never weights) there. An input error prints ``publish.py: error: ...`` and exits with status 2
before anything is uploaded.
"""

import sys

from modeling_tnn.recipes.hub.command import main

if __name__ == "__main__":
    sys.exit(main())
