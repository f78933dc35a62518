#!/usr/bin/env python
"""Pretrain a causal TNN language model with Accelerate (the flags of Hugging Face's ``run_clm_no_trainer.py``).

    python run_scripts/train_clm.py --output_dir outputs/clm --max_train_steps 300 --sample_prompt "The assert"
    accelerate launch --cpu --num_processes 2 run_scripts/train_clm.py --config_name tiny --max_train_steps 20

Without --dataset_name or --train_file it trains on the embedded default corpus. ``--help`` lists every flag; the
logic lives in ``modeling_tnn.recipes`` (the loop: ``pretraining/loop.py``), shared with ``train_mlm.py``.
"""

if __name__ == "__main__":
    from modeling_tnn.recipes.pretraining.cpu_launch import relaunch_dropped_cpu_processes

    relaunch_dropped_cpu_processes()  # first thing: `accelerate launch --cpu` may have dropped processes
    from modeling_tnn.recipes.pretraining.training import cli_main

    cli_main("clm")
