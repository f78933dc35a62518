"""The benchmarks behind every number under ``results/bench_*``: one timing harness (:mod:`.harness`), the models
TNN is compared with (:mod:`.reference_models`), the aten-operator counter (:mod:`.op_count`), the scoped path
policies (:mod:`.policies`), one module per benchmark (training steps, decoding, the compact fit, the token mixers,
the FD kernels' compression), the A/B of two commits (:mod:`.compare`), the plan ``make bench`` runs (:mod:`.plan`)
and the accelerator check (:mod:`.accelerator_check`). ``run_scripts/bench_*.py`` are their entry points.

The modules import each other and ``common`` (which imports nothing; the timing loop lives there) relatively and
take from :mod:`modeling_tnn` only its public model API, so that :mod:`.compare` can run a copy of the same benchmark
code against the model code of another commit. The quality benchmark (:mod:`.quality`), which trains through the
pretraining recipe, is not one :mod:`.compare` runs."""
