#!/usr/bin/env python
"""Pretrain a masked (bidirectional) TNN language model with Accelerate (the flags of Hugging Face's
``run_mlm_no_trainer.py``); tokens are masked by ``DataCollatorForLanguageModeling`` (``--mlm_probability``).

    python run_scripts/train_mlm.py --output_dir outputs/mlm --max_train_steps 300

Without --dataset_name or --train_file it trains on the embedded default corpus. ``--help`` lists every flag; the
logic lives in ``modeling_tnn.recipes`` (the loop: ``pretraining/loop.py``), shared with ``train_clm.py``.
"""

if __name__ == "__main__":
    from modeling_tnn.recipes.pretraining.cpu_launch import relaunch_dropped_cpu_processes

    relaunch_dropped_cpu_processes()  # first thing: `accelerate launch --cpu` may have dropped processes
    from modeling_tnn.recipes.pretraining.training import cli_main

    cli_main("mlm")
