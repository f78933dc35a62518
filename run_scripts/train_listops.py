#!/usr/bin/env python
"""Train a bidirectional TNN (dense, fd or ski mixer) or a matched-size BERT on LRA ListOps with the Trainer.

    python run_scripts/make_listops.py --output_dir data/listops
    python run_scripts/train_listops.py --data_dir data/listops --model tnn-ski --output_dir runs/listops_ski \\
        --max_steps 1000 --per_device_train_batch_size 8 --learning_rate 1e-3 --eval_steps 100 --save_strategy no

Evaluates on the validation split (its first ``--max_eval_samples`` rows if given) every ``--eval_steps`` and at the
end, then on the test split; writes ``all_results.json``, ``trainer_state.json``, the model and tokenizer, and
``learning_curve.png`` (train loss and validation accuracy against the step) to ``--output_dir``. The run is
``modeling_tnn.recipes.listops.commands.train``.
"""

from modeling_tnn.recipes.listops.commands import train as main

if __name__ == "__main__":
    main()
