"""LRA ListOps: the data generator and tokenizer, and the classifiers trained on it (``run_scripts/train_listops.py``)."""
