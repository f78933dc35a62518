"""Every ```python block of the README runs as a newcomer runs it: in a fresh Python process (nothing imported
beforehand, no input to answer a prompt with, offline), in a folder holding only what the README's own steps make:
`outputs/demo` as `make demo` writes it (here the same recipe, a few steps on the tiny preset). A snippet that stops
at transformers' "Do you wish to run the custom code? [y/N]" fails here (no standard input)."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from tests.support import PROJECT_ROOT

SNIPPETS = re.findall(r"```python\n(.*?)```", (PROJECT_ROOT / "README.md").read_text(), re.S)


@pytest.fixture(scope="module")
def demo_folder(tmp_path_factory):
    """A folder with `outputs/demo` from the causal-LM recipe (its saved tokenizer, its saved model)."""
    from modeling_tnn.recipes.pretraining import arguments as lm_arguments
    from modeling_tnn.recipes.pretraining import training as lm_training

    root = tmp_path_factory.mktemp("newcomer")
    argv = ["--config_name", "tiny", "--block_size", "16", "--vocab_size", "300", "--report_to", "none",
            "--max_eval_samples", "8", "--per_device_eval_batch_size", "8", "--max_train_steps", "2",
            "--per_device_train_batch_size", "4", "--output_dir", str(root / "outputs" / "demo")]
    lm_training.run(lm_arguments.parse_args("clm", argv), "clm")
    return root


@pytest.mark.slow
@pytest.mark.parametrize("index", range(len(SNIPPETS)))
def test_a_readme_snippet_runs_as_written_in_a_fresh_process(index, demo_folder):
    snippet = SNIPPETS[index]
    if "peft" in snippet:
        pytest.importorskip("peft", reason="peft is a dev dependency: pip install -e '.[dev]'")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(PROJECT_ROOT), os.environ.get("PYTHONPATH")]))}
    result = subprocess.run([sys.executable, "-c", snippet], cwd=demo_folder, env=env, stdin=subprocess.DEVNULL,
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, f"README snippet {index + 1}:\n{snippet}\n{result.stderr[-3000:]}"
    assert "Do you wish to run the custom code" not in result.stdout + result.stderr
