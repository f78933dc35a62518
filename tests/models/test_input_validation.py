"""Bad model inputs raise a ValueError naming the argument, its shape or range and what is expected."""

from __future__ import annotations

import re

import pytest
import torch

from modeling_tnn import TnnForCausalLM, TnnForMaskedLM, TnnForSequenceClassification
from modeling_tnn.input_validation import validate_model_inputs
from modeling_tnn.modeling_tnn import CACHE_FIELD

from tests.support import tiny_config

VOCAB, WIDTH = 128, 32  # the tiny preset


@pytest.fixture(scope="module")
def models():
    torch.manual_seed(0)
    return {
        "clm": TnnForCausalLM(tiny_config()).eval(),
        "mlm": TnnForMaskedLM(tiny_config("ski")).eval(),
        "cls": TnnForSequenceClassification(tiny_config(num_labels=2)).eval(),
    }


def ids(*rows):
    return torch.tensor(rows, dtype=torch.long)


BAD_INPUTS = [
    # (id, model, call, kwargs, expected message fragment, a regular expression)
    ("empty-sequence", "clm", "forward", dict(input_ids=torch.zeros(1, 0, dtype=torch.long)),
     r"input_ids has no tokens \(shape \(1, 0\)\): pass at least one token"),
    ("empty-sequence-mlm", "mlm", "forward", dict(input_ids=torch.zeros(2, 0, dtype=torch.long)),
     r"input_ids has no tokens \(shape \(2, 0\)\)"),
    ("empty-sequence-cls", "cls", "forward", dict(input_ids=torch.zeros(1, 0, dtype=torch.long)),
     r"input_ids has no tokens \(shape \(1, 0\)\)"),
    ("empty-prompt-generate", "clm", "generate", dict(input_ids=torch.zeros(1, 0, dtype=torch.long)),
     r"input_ids has no tokens \(shape \(1, 0\)\).*generate prompt.*BOS"),
    ("empty-batch", "clm", "forward", dict(input_ids=torch.zeros(0, 5, dtype=torch.long)),
     r"input_ids has an empty batch \(shape \(0, 5\)\): pass at least one sequence"),
    ("empty-batch-mlm", "mlm", "forward", dict(input_ids=torch.zeros(0, 5, dtype=torch.long)),
     r"input_ids has an empty batch \(shape \(0, 5\)\)"),
    ("ids-1d", "clm", "forward", dict(input_ids=torch.arange(1, 6)),
     r"input_ids must be 2-D \(batch, sequence\), got shape \(5,\); for a single sequence pass input_ids\[None\]"),
    ("ids-1d-cls", "cls", "forward", dict(input_ids=torch.arange(1, 6)),
     r"input_ids must be 2-D \(batch, sequence\), got shape \(5,\)"),
    ("ids-3d", "clm", "forward", dict(input_ids=torch.ones(1, 2, 3, dtype=torch.long)),
     r"input_ids must be 2-D \(batch, sequence\), got shape \(1, 2, 3\)"),
    ("ids-float", "clm", "forward", dict(input_ids=torch.ones(1, 3)),
     r"input_ids must hold integer token ids \(torch.long\), got dtype torch.float32"),
    ("ids-list", "clm", "forward", dict(input_ids=[[1, 2]]), r"input_ids must be a torch.Tensor.*got list"),
    ("id-equal-vocab", "clm", "forward", dict(input_ids=ids([1, VOCAB])),
     r"input_ids must lie in \[0, vocab_size\) = \[0, 128\), got values from 1 to 128"),
    ("id-past-vocab-mlm", "mlm", "forward", dict(input_ids=ids([5, 1000])),
     r"input_ids must lie in \[0, vocab_size\) = \[0, 128\), got values from 5 to 1000"),
    ("id-negative", "clm", "forward", dict(input_ids=ids([-1, 3])),
     r"input_ids must lie in \[0, vocab_size\) = \[0, 128\), got values from -1 to 3"),
    ("id-ignore-index", "clm", "forward", dict(input_ids=ids([4, -100])), r"got values from -100 to 4.*-100"),
    ("id-past-vocab-generate", "clm", "generate", dict(input_ids=ids([1, 200])),
     r"input_ids must lie in \[0, vocab_size\) = \[0, 128\)"),
    ("mask-half", "clm", "forward", dict(input_ids=ids([1, 2]), attention_mask=torch.tensor([[1.0, 0.5]])),
     r"attention_mask must hold only 0 \(padding\) and 1 \(token\), got the value 0.5 \(dtype torch.float32\)"),
    ("mask-two", "mlm", "forward", dict(input_ids=ids([1, 2]), attention_mask=ids([1, 2])),
     r"attention_mask must hold only 0 \(padding\) and 1 \(token\), got the value 2 \(dtype torch.int64\)"),
    ("mask-additive", "cls", "forward",
     dict(input_ids=ids([1, 2]), attention_mask=torch.tensor([[0.0, float("-inf")]])),
     r"attention_mask must hold only 0 \(padding\) and 1 \(token\), got the value -inf"),
    ("mask-half-generate", "clm", "generate", dict(input_ids=ids([1, 2]), attention_mask=torch.tensor([[0.5, 1.0]])),
     r"attention_mask must hold only 0 \(padding\) and 1 \(token\), got the value 0.5"),
    ("mask-wider", "clm", "forward", dict(input_ids=ids([1, 2]), attention_mask=torch.ones(1, 3)),
     r"attention_mask must be a 2-D \(batch, sequence\) padding mask of shape \(1, 2\), got shape \(1, 3\)"),
    ("mask-other-batch", "mlm", "forward", dict(input_ids=ids([1, 2]), attention_mask=torch.ones(2, 2)),
     r"attention_mask must be a 2-D \(batch, sequence\) padding mask of shape \(1, 2\), got shape \(2, 2\)"),
    ("mask-1d", "clm", "forward", dict(input_ids=ids([1, 2]), attention_mask=torch.ones(2)),
     r"attention_mask must be a 2-D \(batch, sequence\) padding mask of shape \(1, 2\), got shape \(2,\)"),
    ("mask-4d", "clm", "forward", dict(input_ids=ids([1, 2]), attention_mask=torch.ones(1, 1, 2, 2)),
     r"attention_mask must be a 2-D \(batch, sequence\) padding mask of shape \(1, 2\), got shape \(1, 1, 2, 2\)"),
    ("embeds-width", "clm", "forward", dict(inputs_embeds=torch.randn(1, 3, 7)),
     r"inputs_embeds must have shape \(batch, sequence, hidden_size=32\), got shape \(1, 3, 7\)"),
    ("embeds-width-mlm", "mlm", "forward", dict(inputs_embeds=torch.randn(2, 3, WIDTH + 1)),
     r"inputs_embeds must have shape \(batch, sequence, hidden_size=32\), got shape \(2, 3, 33\)"),
    ("embeds-2d", "clm", "forward", dict(inputs_embeds=torch.randn(3, WIDTH)),
     r"inputs_embeds must have shape \(batch, sequence, hidden_size=32\), got shape \(3, 32\)"),
    ("embeds-integer", "clm", "forward", dict(inputs_embeds=torch.ones(1, 3, WIDTH, dtype=torch.long)),
     r"inputs_embeds must be a floating tensor, got dtype torch.int64"),
    ("embeds-empty-sequence", "clm", "forward", dict(inputs_embeds=torch.randn(1, 0, WIDTH)),
     r"inputs_embeds has no tokens \(shape \(1, 0, 32\)\)"),
    ("both", "clm", "forward", dict(input_ids=ids([1]), inputs_embeds=torch.randn(1, 1, WIDTH)),
     r"Pass exactly one of input_ids and inputs_embeds \(got both\)"),
    ("neither", "mlm", "forward", dict(), r"Pass exactly one of input_ids and inputs_embeds \(got neither\)"),
    ("neither-cls", "cls", "forward", dict(), r"Pass exactly one of input_ids and inputs_embeds \(got neither\)"),
]


@pytest.mark.parametrize("model_key, call, kwargs, expected", [case[1:] for case in BAD_INPUTS],
                         ids=[case[0] for case in BAD_INPUTS])
def test_bad_input_raises_a_value_error_naming_it(models, model_key, call, kwargs, expected):
    model = models[model_key]
    with pytest.raises(ValueError, match=expected), torch.no_grad():
        if call == "generate":
            model.generate(**kwargs, max_new_tokens=2, do_sample=False, pad_token_id=0)
        else:
            model(**kwargs)


def test_every_mask_dtype_of_zeros_and_ones_is_accepted_alike(models):
    model = models["clm"]
    input_ids = ids([5, 6, 7], [0, 8, 9])
    mask = torch.tensor([[1, 1, 1], [0, 1, 1]])
    with torch.no_grad():
        reference = model(input_ids, attention_mask=mask).logits
        for variant in (mask.bool(), mask.float(), mask.to(torch.int32), mask.to(torch.bfloat16)):
            torch.testing.assert_close(model(input_ids, attention_mask=variant).logits, reference)


def test_decoding_mask_may_cover_the_cached_past(models):
    model = models["clm"]
    with torch.no_grad():
        cache = getattr(model(ids([5, 6, 7]), use_cache=True), CACHE_FIELD)
        step = model(ids([8]), attention_mask=torch.ones(1, 4, dtype=torch.long), cache=cache, use_cache=True)
        assert step.logits.shape == (1, 1, VOCAB)
        with pytest.raises(ValueError, match=re.escape("of shape (1, >= 1), got shape (2, 4)")):
            model(ids([9]), attention_mask=torch.ones(2, 4), cache=getattr(step, CACHE_FIELD), use_cache=True)


def test_value_checks_are_skipped_while_compiling(monkeypatch):
    # torch.compile traces the model: a data-dependent branch would break the graph, so only metadata is checked.
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    validate_model_inputs(ids([1, 999]), torch.tensor([[1.0, 0.5]]), None, vocab_size=VOCAB, hidden_size=WIDTH)
    with pytest.raises(ValueError, match="input_ids has no tokens"):
        validate_model_inputs(torch.zeros(1, 0, dtype=torch.long), None, None, vocab_size=VOCAB, hidden_size=WIDTH)


def test_value_checks_cost_one_host_synchronisation(monkeypatch):
    calls = []
    original = torch.Tensor.tolist
    monkeypatch.setattr(torch.Tensor, "tolist", lambda self: calls.append(1) or original(self))
    monkeypatch.setattr(torch.Tensor, "item", lambda self: pytest.fail("unexpected .item() sync"))
    validate_model_inputs(ids([1, 2]), torch.tensor([[1.0, 1.0]]), None, vocab_size=VOCAB, hidden_size=WIDTH)
    assert len(calls) == 1


def test_saved_folder_ships_the_validation_module(tmp_path, models):
    # Remote code: transformers copies the modules modeling_tnn.py imports relatively.
    models["clm"].save_pretrained(tmp_path)
    assert (tmp_path / "input_validation.py").is_file()
