"""Running a script in a fresh interpreter where some packages cannot be imported: ``modeling_tnn`` (so that only the
code copied beside saved weights, the remote code, can run) or the ``train`` extra's packages (the light install)."""

from __future__ import annotations

import inspect
import os
import subprocess
import sys
import textwrap
from collections.abc import Sequence
from pathlib import Path

from tests.support import main_output

# None in sys.modules: importing the package (or a submodule) raises ModuleNotFoundError, as if it were not installed,
# and importlib.util.find_spec finds nothing. torch and transformers are imported for the script.
_BLOCK = textwrap.dedent("""
    import sys
    for _name in {blocked!r}:
        sys.modules[_name] = None
    import torch, transformers
    torch.set_num_threads(1)  # as the tests' own process (conftest), so that outputs compare bit for bit
""")
# Helpers every script may call: the tests' own main_output (its source, so that both sides read outputs alike) and
# load_remote.
_HELPERS = inspect.getsource(main_output) + textwrap.dedent('''
    def load_remote(auto_class, source, **kwargs):
        """transformers.<auto_class>.from_pretrained(source) as remote code, in eval mode, checked to be the code
        copied beside the weights (a module under transformers_modules), not an installed package."""
        model = getattr(transformers, auto_class).from_pretrained(source, trust_remote_code=True, **kwargs).eval()
        assert type(model).__module__.startswith("transformers_modules"), type(model).__module__
        return model
''')


def run_python(body: str, cwd: Path, blocked: Sequence[str] = ("modeling_tnn",),
               extra_env: dict[str, str] | None = None, timeout: float = 240) -> subprocess.CompletedProcess:
    """Run the Python source ``body`` (dedented; ``torch`` and ``transformers`` are already imported, and the helpers
    ``main_output`` and ``load_remote`` defined) in a fresh interpreter where the packages ``blocked`` cannot be
    imported, offline (``HF_HUB_OFFLINE=1``, no token), with its own remote-code module cache under ``cwd``, on one
    thread. Returns the finished process (``stdout`` and ``stderr`` as text); its exit status is the caller's to
    check."""
    script = _BLOCK.format(blocked=tuple(blocked)) + _HELPERS + textwrap.dedent(body)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_MODULES_CACHE": str(Path(cwd) / "modules"), "PYTHONPATH": "",
           "OMP_NUM_THREADS": "1", **(extra_env or {})}  # tiny models: threads only add contention
    env.pop("HF_TOKEN", None)
    return subprocess.run([sys.executable, "-c", script], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout, stdin=subprocess.DEVNULL)


def run_with_package_blocked(body: str, cwd: Path, extra_env: dict[str, str] | None = None,
                             timeout: float = 240) -> subprocess.CompletedProcess:
    """:func:`run_python` with ``modeling_tnn`` blocked, failing the calling test with the end of stderr unless the
    script exits with 0."""
    proc = run_python(body, cwd, extra_env=extra_env, timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return proc
