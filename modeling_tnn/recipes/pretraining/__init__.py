"""Pretraining a TNN language model (causal or masked) with Accelerate: arguments, data, tokenizer, the loop, checkpoints,
evaluation, generation, tracking. ``run_scripts/train_clm.py`` and ``train_mlm.py`` run :func:`.training.cli_main`."""
