"""Converting the original fairseq TNN checkpoints to transformers folders (``run_scripts/convert_fairseq_checkpoint.py``)."""
