"""test_modeling_tnn.py is a module of transformers' test tree (its imports are relative to that tree): it runs there,
through tests/models/test_transformers_mixins.py, never collected from here."""

collect_ignore = ["test_modeling_tnn.py"]
