#!/usr/bin/env python
"""Finetune one or more checkpoints on every GLUE task available locally, in sequence, and write one results table
(``glue_results.md`` and ``glue_results.json``) with the majority-class baseline beside them.

Each (model, task) pair is one ``finetune_glue.py`` run in its own process; arguments after ``--`` go to every run,
``--task_args TASK=ARGS`` to one task's runs. A task is available when its ``train.tsv`` and dev file(s) exist under
``--glue_dir`` (here: CoLA, SST-2, MRPC, STS-B, RTE, WNLI; QNLI has only its dev split, MNLI and QQP are absent).
Before any run starts, a checkpoint folder that does not exist, a missing ``--glue_dir`` or a GLUE file that does not
match its task prints one ``error:`` line naming it and exits with status 2.

Example::

    python run_scripts/run_glue_suite.py --model tnn=outputs/mlm_tnn --model bert=outputs/mlm_bert \\
        --tasks cola,sst2,mrpc,stsb,rte --task_args "sst2=--max_train_samples 8000" \\
        --output_dir outputs/glue --results_dir results/glue -- --num_train_epochs 3 --learning_rate 1e-3
"""

from modeling_tnn.recipes.glue.suite import cli

if __name__ == "__main__":
    cli()
