"""The light install: the model works with only its required dependencies (the `train` extra's packages made
unimportable in a subprocess), and a recipe started without the extra stops with the command that installs it."""

from __future__ import annotations

import subprocess
import sys
import textwrap

from conftest import PROJECT_ROOT

from modeling_tnn.recipes.common.extras import INSTALL_COMMAND

# The `train` extra's packages that nothing in the model's own dependencies pulls in (transformers itself needs
# numpy and tqdm).
TRAIN_ONLY = ("accelerate", "datasets", "sklearn", "scipy", "matplotlib")


def _run_without(packages: tuple[str, ...], code: str) -> subprocess.CompletedProcess:
    """Run ``code`` in a fresh interpreter where ``packages`` cannot be imported (``sys.modules[name] = None``:
    an import raises ModuleNotFoundError and ``importlib.util.find_spec`` finds nothing)."""
    preamble = f"import sys\nfor _name in {packages!r}:\n    sys.modules[_name] = None\n"
    return subprocess.run([sys.executable, "-c", preamble + textwrap.dedent(code)], cwd=PROJECT_ROOT,
                          capture_output=True, text=True, timeout=240)


def test_model_builds_saves_loads_and_generates_without_the_train_extra(tmp_path):
    result = _run_without(TRAIN_ONLY, f"""
        import torch
        from transformers import AutoModelForCausalLM
        import modeling_tnn
        torch.set_num_threads(1)
        torch.manual_seed(0)
        model = modeling_tnn.TnnForCausalLM(modeling_tnn.load_preset("tiny", dropout=0.0, pad_token_id=0)).eval()
        model.save_pretrained({str(tmp_path)!r})
        loaded = AutoModelForCausalLM.from_pretrained({str(tmp_path)!r}).eval()
        prompt = torch.tensor([[5, 6, 7]])
        ours = model.generate(prompt, max_new_tokens=4, do_sample=False, pad_token_id=0)
        theirs = loaded.generate(prompt, max_new_tokens=4, do_sample=False, pad_token_id=0)
        assert ours.shape == (1, 7) and torch.equal(ours, theirs), (ours, theirs)
        leaked = sorted(name for name in sys.modules if name.startswith("modeling_tnn.recipes"))
        assert not leaked, leaked
        print("generated", ours.tolist())
    """)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "generated [[5, 6, 7," in result.stdout


def test_a_recipe_without_the_train_extra_names_the_install_command():
    result = _run_without(("datasets",), """
        import runpy
        sys.argv = ["train_clm.py", "--help"]
        runpy.run_path("run_scripts/train_clm.py", run_name="__main__")
    """)
    assert result.returncode != 0
    last_line = result.stderr.strip().splitlines()[-1]
    assert last_line.startswith("ModuleNotFoundError: modeling_tnn.recipes needs datasets,"), last_line
    assert INSTALL_COMMAND in last_line and "scikit-learn" not in last_line
