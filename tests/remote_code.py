"""Running a script where ``modeling_tnn`` cannot be imported, so that only the code copied beside saved weights (the
remote code) can run: the tests of every folder the project writes load them this way."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

from conftest import PROJECT_ROOT

# A meta-path finder refuses modeling_tnn and the project root leaves sys.path; torch and transformers are imported.
_BLOCK_PACKAGE = textwrap.dedent("""
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


def run_with_package_blocked(body: str, cwd: Path, extra_env: dict[str, str] | None = None,
                             timeout: float = 240) -> subprocess.CompletedProcess:
    """Run the Python source ``body`` (dedented; ``torch`` and ``transformers`` are already imported) in a fresh
    interpreter where ``modeling_tnn`` is blocked, offline (``HF_HUB_OFFLINE=1``, no token), with its own remote-code
    module cache under ``cwd``, on one thread. Fails the calling test with the end of stderr unless it exits with 0;
    returns the finished process (its ``stdout`` and ``stderr`` as text)."""
    script = _BLOCK_PACKAGE.format(root=str(PROJECT_ROOT)) + textwrap.dedent(body)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_MODULES_CACHE": str(Path(cwd) / "modules"), "PYTHONPATH": "",
           "OMP_NUM_THREADS": "1", **(extra_env or {})}  # tiny models: threads only add contention
    env.pop("HF_TOKEN", None)
    proc = subprocess.run([sys.executable, "-c", script], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return proc
