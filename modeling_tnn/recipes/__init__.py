"""Training, evaluation and publishing machinery behind the scripts in ``run_scripts/``, one subpackage per task:
``common`` (what every group uses), ``pretraining``, ``glue``, ``listops``, ``hub``, ``fairseq``, ``benchmarks``
(the timing harness and every benchmark behind ``results/bench_*``) and ``docs`` (the docs' tables included from
``results/``).

The model modules of :mod:`modeling_tnn` never import this subpackage, so the code copied next to a saved model (and
to the Hub) stays the model alone. The recipes need the ``train`` extra (``pip install -e ".[train]"`` from a
checkout); importing them without it stops here with the command that installs it where the package runs.
"""

from .common.extras import require_train_extra

require_train_extra()
