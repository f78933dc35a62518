"""Training, evaluation and publishing machinery behind the scripts in ``run_scripts/``.

The model modules of :mod:`modeling_tnn` never import this subpackage, so the code copied next to a saved model (and
to the Hub) stays the model alone.
"""
