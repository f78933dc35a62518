"""The docs' included tables: ``includes.py`` fills every ``<!-- include: PATH -->`` block of the pages from the
generated files under ``results/`` (``run_scripts/render_docs.py``). Standard library only."""
