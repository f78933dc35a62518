"""The start of every subprocess script that loads saved folders as remote code: ``modeling_tnn`` is made
unimportable (a meta-path finder refuses it and the project root leaves ``sys.path``), so only the code copied
beside the weights can run. Format it with ``root=<project root>``; it imports ``torch`` and ``transformers``."""

import textwrap

BLOCK_PACKAGE_PREAMBLE = textwrap.dedent("""
    import importlib.abc, sys
    class BlockTnn(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name == "modeling_tnn" or name.startswith("modeling_tnn."):
                raise ImportError("modeling_tnn is blocked in this test")
    sys.meta_path.insert(0, BlockTnn())
    sys.path = [p for p in sys.path if p not in ("", {root!r})]
    import torch, transformers
    torch.set_num_threads(1)  # as the tests' own process (conftest), so that outputs compare bit for bit
    try:
        import modeling_tnn
        raise SystemExit("modeling_tnn should not be importable here")
    except ImportError:
        pass
""")
