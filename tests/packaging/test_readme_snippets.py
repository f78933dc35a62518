"""Every ```python block of the README runs as written, offline, in a folder that holds what the snippets load: the
`outputs/demo` folder `make demo` writes (here a tiny causal LM with a tokenizer trained on the fly) and the
`my-tnn-ner` / `my-tnn-qa` folders of the question-answering recipe."""

from __future__ import annotations

import re

import pytest

from modeling_tnn import TnnForCausalLM, TnnForQuestionAnswering, TnnForTokenClassification

from tests.support import PROJECT_ROOT, save_with_tokenizer, tiny_config_for

SNIPPETS = re.findall(r"```python\n(.*?)```", (PROJECT_ROOT / "README.md").read_text(), re.S)


# What each snippet shows, told by a call only it makes (first match wins).
KINDS = (("question-answering", "AutoModelForQuestionAnswering"), ("trainer", "Trainer("), ("peft", "get_peft_model"),
         ("generate", ".generate("), ("pipeline", "pipeline("), ("save-and-load", "save_pretrained"))


def snippet_kind(snippet: str) -> str:
    return next(kind for kind, call in KINDS if call in snippet)


@pytest.fixture
def readme_folders(tmp_path, monkeypatch, tokenizer):
    for folder, cls in (("outputs/demo", TnnForCausalLM), ("my-tnn-ner", TnnForTokenClassification),
                        ("my-tnn-qa", TnnForQuestionAnswering)):
        save_with_tokenizer(cls(tiny_config_for(tokenizer)), tokenizer, tmp_path / folder)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_the_readme_shows_every_use():
    assert sorted(snippet_kind(s) for s in SNIPPETS) == sorted(kind for kind, _ in KINDS)


@pytest.mark.parametrize("snippet", [  # the Trainer snippet trains: marked slow, as the suite's other Trainer runs
    pytest.param(s, id=snippet_kind(s), marks=[pytest.mark.slow] if snippet_kind(s) == "trainer" else [])
    for s in SNIPPETS])
def test_readme_snippet_runs(snippet, readme_folders, capsys):
    kind = snippet_kind(snippet)
    if kind == "peft":
        pytest.importorskip("peft", reason="peft is a dev dependency: pip install -e '.[dev]'")
    namespace: dict = {}
    exec(compile(snippet, "README.md", "exec"), namespace)
    printed = capsys.readouterr().out
    if kind == "save-and-load":
        assert (readme_folders / "my-tnn" / "config.json").is_file()
        assert type(namespace["model"]).__name__ == "TnnForCausalLM"
    elif kind == "generate":  # new tokens after the prompt
        assert namespace["out"].shape[1] > namespace["inputs"]["input_ids"].shape[1]
    elif kind == "pipeline":
        assert printed.startswith("The assert statement")
    elif kind == "question-answering":
        assert namespace["answer"] in namespace["context"] and isinstance(namespace["entities"], list)
    elif kind == "trainer":
        assert namespace["trainer"].state.global_step > 0
        assert (readme_folders / "outputs" / "classifier" / "model.safetensors").is_file()
    else:  # peft: only the adapters train
        trainable = [name for name, p in namespace["model"].named_parameters() if p.requires_grad]
        assert trainable and all("lora_" in name for name in trainable) and "trainable params" in printed
