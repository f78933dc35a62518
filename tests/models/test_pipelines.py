"""transformers pipelines on saved folders that hold a tokenizer, loaded as remote code."""

from __future__ import annotations

import pytest
from transformers import pipeline

from modeling_tnn import TnnForCausalLM, TnnForMaskedLM, TnnForSequenceClassification

from tests.support import save_with_tokenizer, tiny_config_for


def test_text_generation_pipeline(tmp_path, tokenizer):
    folder = save_with_tokenizer(TnnForCausalLM(tiny_config_for(tokenizer)), tokenizer, tmp_path)
    generator = pipeline("text-generation", model=folder, trust_remote_code=True)
    out = generator("The assert statement", max_new_tokens=8, do_sample=False)
    assert out[0]["generated_text"].startswith("The assert statement")
    assert len(out[0]["generated_text"]) > len("The assert statement")


def test_fill_mask_pipeline(tmp_path, tokenizer):
    folder = save_with_tokenizer(TnnForMaskedLM(tiny_config_for(tokenizer)), tokenizer, tmp_path)
    fill = pipeline("fill-mask", model=folder, trust_remote_code=True)
    out = fill(f"The {tokenizer.mask_token} statement", top_k=3)
    assert len(out) == 3 and all("score" in o and "token_str" in o for o in out)


@pytest.mark.parametrize("causal", [False, True])
def test_text_classification_pipeline(tmp_path, tokenizer, causal):
    config = tiny_config_for(tokenizer, causal=causal, num_labels=2, id2label={0: "neg", 1: "pos"},
                     label2id={"neg": 0, "pos": 1})
    folder = save_with_tokenizer(TnnForSequenceClassification(config), tokenizer, tmp_path)
    classify = pipeline("text-classification", model=folder, trust_remote_code=True)
    out = classify(["a fine statement", "an assert statement that is much longer than the first one"])
    assert [o["label"] in {"neg", "pos"} for o in out] == [True, True]
