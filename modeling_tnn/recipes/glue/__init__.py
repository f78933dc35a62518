"""GLUE finetuning with the transformers Trainer: the tasks and their tsv files, data files, metrics, arguments, the
finetuning run (``run_scripts/finetune_glue.py``) and the suite over every task (``run_scripts/run_glue_suite.py``)."""
