#!/usr/bin/env python
"""Convert a TNN checkpoint trained with the authors' fairseq code (OpenNLPLab/fairseq-evo) into a Hub-ready folder.

Examples::

    # the WikiText-103 causal LM (arch tnn_v2_decay_99_pre), with its fairseq dictionary as a tokenizer
    python run_scripts/convert_fairseq_checkpoint.py --checkpoint_path checkpoints/tnn/checkpoint_best.pt \\
        --dictionary data-bin/wikitext-103/dict.txt --pytorch_dump_folder_path outputs/tnn-wt103-fairseq

The folder holds config.json (with auto_map), the model code and model.safetensors (and the tokenizer files with
--dictionary); it loads with AutoModelForCausalLM or AutoModelForMaskedLM, with or without trust_remote_code. What is
refused, and why, is described in modeling_tnn/recipes/fairseq/conversion.py and the README; a refusal prints
``convert_fairseq_checkpoint.py: error: ...`` and exits with status 2 before anything is written. The command line
is modeling_tnn/recipes/fairseq/command.py.
"""

from modeling_tnn.recipes.fairseq.command import main

if __name__ == "__main__":
    main()
