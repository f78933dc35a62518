"""The light install: the model works with only its required dependencies (the `train` extra's packages made
unimportable in a subprocess), and a recipe started without the extra stops with the command that installs it."""

from __future__ import annotations

import pytest
from tests.support import PROJECT_ROOT
from tests.remote_code import run_python

from modeling_tnn.recipes.common.extras import INSTALL_COMMAND

# The `train` extra's packages that nothing in the model's own dependencies pulls in (transformers itself needs
# numpy and tqdm).
TRAIN_ONLY = ("accelerate", "datasets", "sklearn", "scipy", "matplotlib")


@pytest.mark.slow
def test_model_builds_saves_loads_and_generates_without_the_train_extra(tmp_path):
    result = run_python(f"""
        from transformers import AutoModelForCausalLM
        import modeling_tnn
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
    """, tmp_path, blocked=TRAIN_ONLY)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "generated [[5, 6, 7," in result.stdout


@pytest.mark.slow
def test_a_recipe_without_the_train_extra_names_the_install_command(tmp_path):
    result = run_python(f"""
        import runpy
        sys.argv = ["train_clm.py", "--help"]
        runpy.run_path({str(PROJECT_ROOT / "run_scripts" / "train_clm.py")!r}, run_name="__main__")
    """, tmp_path, blocked=("datasets",))
    assert result.returncode != 0
    last_line = result.stderr.strip().splitlines()[-1]
    assert last_line.startswith("ModuleNotFoundError: modeling_tnn.recipes needs datasets,"), last_line
    assert INSTALL_COMMAND in last_line and "scikit-learn" not in last_line
