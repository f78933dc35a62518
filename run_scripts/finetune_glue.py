#!/usr/bin/env python
"""Finetune a TNN (or any ``AutoModelForSequenceClassification`` model) on a GLUE task with ``Trainer``.

It follows the conventions of HF's ``run_glue.py``: ``HfArgumentParser`` over model, data and ``TrainingArguments``
(or one ``.json`` file holding them all), ``--task_name`` for the nine GLUE tasks or ``--train_file`` /
``--validation_file`` / ``--test_file`` (csv or json) for other data, dynamic padding with
``DataCollatorWithPadding``, ``eval_results.json`` with ``eval_`` prefixes, ``--do_predict``, and a model card in the
output folder. It works offline: data comes from ``--glue_dir`` (the official GLUE tsv layout; for this project
``$TNN_DATA_DIR/glue``) or the data files, and the metrics are computed with scikit-learn/scipy (``glue_data.py``),
never ``evaluate.load``. Without ``--glue_dir`` the Hub dataset ``--dataset_name`` (``nyu-mll/glue``) is loaded.

Examples::

    # from a pretrained (masked LM) checkpoint folder holding a tokenizer; also write the test-set predictions
    python run_scripts/finetune_glue.py --model_name_or_path outputs/mlm --task_name sst2 \\
        --glue_dir "$TNN_DATA_DIR/glue" --do_train --do_eval --do_predict --output_dir outputs/glue/sst2
    # from scratch: a preset (or config path) and a tokenizer folder
    python run_scripts/finetune_glue.py --config_name small --tokenizer_name outputs/mlm --task_name rte ...
    # your own data: csv or json with a `label` column
    python run_scripts/finetune_glue.py --model_name_or_path outputs/mlm --train_file train.csv \\
        --validation_file dev.csv --do_train --do_eval --output_dir outputs/mine

MNLI is evaluated on the matched and the mismatched dev sets (the latter's metrics get an ``_mm`` suffix).
``--do_predict`` writes one file per test set in the GLUE submission format (``SST-2.tsv``, ``MNLI-m.tsv``,
``MNLI-mm.tsv``, ``AX.tsv``, ...: ``index<TAB>prediction``), or ``predict_results.tsv`` for a ``--test_file``.
Input errors (a missing local folder or file, an empty file, a missing column) print one ``error:`` line and exit
with status 2 before anything is trained.
"""

from modeling_tnn.recipes.glue.finetuning import cli

if __name__ == "__main__":
    cli()
