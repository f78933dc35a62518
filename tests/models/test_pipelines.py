"""transformers pipelines on saved folders that hold a tokenizer, loaded as remote code."""

from __future__ import annotations

import pytest
from transformers import pipeline

from modeling_tnn import TnnForCausalLM, TnnForMaskedLM, TnnForSequenceClassification

from tests.support import tiny_config


def _save(tmp_path, model, tokenizer):
    model.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    return str(tmp_path)


def _config(tokenizer, **kwargs):
    return tiny_config(vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id,
                       bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id, **kwargs)


def test_text_generation_pipeline(tmp_path, tokenizer):
    folder = _save(tmp_path, TnnForCausalLM(_config(tokenizer)), tokenizer)
    generator = pipeline("text-generation", model=folder, trust_remote_code=True)
    out = generator("The assert statement", max_new_tokens=8, do_sample=False)
    assert out[0]["generated_text"].startswith("The assert statement")
    assert len(out[0]["generated_text"]) > len("The assert statement")


def test_fill_mask_pipeline(tmp_path, tokenizer):
    folder = _save(tmp_path, TnnForMaskedLM(_config(tokenizer)), tokenizer)
    fill = pipeline("fill-mask", model=folder, trust_remote_code=True)
    out = fill(f"The {tokenizer.mask_token} statement", top_k=3)
    assert len(out) == 3 and all("score" in o and "token_str" in o for o in out)


@pytest.mark.parametrize("causal", [False, True])
def test_text_classification_pipeline(tmp_path, tokenizer, causal):
    config = _config(tokenizer, causal=causal, num_labels=2, id2label={0: "neg", 1: "pos"},
                     label2id={"neg": 0, "pos": 1})
    folder = _save(tmp_path, TnnForSequenceClassification(config), tokenizer)
    classify = pipeline("text-classification", model=folder, trust_remote_code=True)
    out = classify(["a fine statement", "an assert statement that is much longer than the first one"])
    assert [o["label"] in {"neg", "pos"} for o in out] == [True, True]
