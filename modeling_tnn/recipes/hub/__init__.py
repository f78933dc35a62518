"""Publishing a run folder to the Hugging Face Hub: reading the run, the model card, the allow-listed folder, the upload
and ``run_scripts/publish.py``'s command line. What a card needs about a benchmark task it reads from the run folder."""
