"""Packed batches (DataCollatorWithFlattening in each of its modes) through every head: each document's outputs and
gradients equal the document run alone; the keywords a forward takes are used or refused; generate's position_ids
(left and right padding, beams, continuation) are never read as document breaks."""

from __future__ import annotations

import pytest
import torch
from transformers import DataCollatorWithFlattening, LlamaConfig, LlamaForCausalLM
from transformers.testing_utils import CaptureLogger
from transformers.utils import logging as transformers_logging

from modeling_tnn import (TnnForCausalLM, TnnForMaskedLM, TnnForQuestionAnswering, TnnForSequenceClassification,
                          TnnForTokenClassification, TnnModel)

from modeling_tnn.ops_documents import build_layout

from tests.support import tiny_config

LENGTHS = (7, 3, 12, 1, 5)
MODES = {
    "position_ids": {},
    "flash_kwargs": {"return_flash_attn_kwargs": True},
    "flash_kwargs_only": {"return_flash_attn_kwargs": True, "return_position_ids": False},
    "seq_idx": {"return_seq_idx": True},
    "seq_idx_only": {"return_seq_idx": True, "return_position_ids": False},
}
HEADS = [(TnnForCausalLM, "dense"), (TnnForCausalLM, "fd"), (TnnForMaskedLM, "dense"), (TnnForMaskedLM, "fd"),
         (TnnForMaskedLM, "ski"), (TnnForTokenClassification, "dense"), (TnnForTokenClassification, "ski"),
         (TnnForTokenClassification, "fd")]


def documents(vocab: int = 99) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(1)
    return [torch.randint(1, vocab, (n,), generator=generator) for n in LENGTHS]


def packed(docs: list[torch.Tensor], **collator) -> dict:
    batch = DataCollatorWithFlattening(return_tensors="pt", **collator)([{"input_ids": d} for d in docs])
    batch.pop("labels")
    return batch


def build(model_class, mixer: str, **overrides):
    torch.manual_seed(0)
    causal = model_class is TnnForCausalLM or (model_class is TnnForTokenClassification and mixer == "fd")
    return model_class(tiny_config(mixer, causal=causal, num_labels=3, ski_rank=3, **overrides)).double().eval()


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("model_class,mixer", HEADS)
def test_each_document_of_a_packed_batch_equals_it_alone(model_class, mixer, mode):
    model = build(model_class, mixer)
    docs = documents()
    batch = packed(docs, **MODES[mode])
    logits = model(**batch).logits[0]
    weights = torch.randn(logits.shape, dtype=logits.dtype, generator=torch.Generator().manual_seed(2))
    grads = torch.autograd.grad((logits * weights).sum(), list(model.parameters()), allow_unused=True)
    alone = torch.cat([model(d[None]).logits[0] for d in docs])
    expected = torch.autograd.grad((alone * weights).sum(), list(model.parameters()), allow_unused=True)
    torch.testing.assert_close(logits, alone, rtol=1e-5, atol=1e-7)
    for got, want in zip(grads, expected):
        if want is not None:
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-7)
    together = model(input_ids=batch["input_ids"]).logits[0]  # the same row read as one document differs
    assert not torch.allclose(together, alone, atol=1e-4)


@pytest.mark.parametrize("mixer,causal", [("dense", False), ("ski", False), ("fd", True)])
def test_sequence_classification_pools_per_document(mixer, causal):
    torch.manual_seed(0)
    model = TnnForSequenceClassification(tiny_config(mixer, causal=causal, num_labels=3, ski_rank=3)).double().eval()
    docs = documents()
    out = model(**packed(docs, return_flash_attn_kwargs=True), labels=torch.tensor([0, 1, 2, 1, 0]))
    alone = torch.cat([model(d[None]).logits for d in docs])
    assert out.logits.shape == (len(docs), 3)
    torch.testing.assert_close(out.logits, alone, rtol=1e-5, atol=1e-7)
    assert torch.isfinite(out.loss)


def test_question_answering_refuses_packed_batches():
    model = build(TnnForQuestionAnswering, "dense")
    with pytest.raises(ValueError, match="packed"):
        model(**packed(documents()))


def test_a_packed_batch_returns_no_cache_and_refuses_one():
    model = build(TnnForCausalLM, "dense")
    batch = packed(documents())
    out = model(**batch)
    assert getattr(out, "cache", None) is None and getattr(out, "past_key_values", None) is None
    with pytest.raises(ValueError, match="use_cache"):
        model(**batch, use_cache=True)
    cache = model(documents()[0][None]).past_key_values if hasattr(out, "past_key_values") else \
        model(documents()[0][None]).cache
    with pytest.raises(ValueError, match="position_ids"):
        model(input_ids=batch["input_ids"], position_ids=batch["position_ids"], **{_cache_name(out): cache})
    with pytest.raises(ValueError, match="cu_seq_lens"):
        flash = packed(documents(), return_flash_attn_kwargs=True, return_position_ids=False)
        model(**flash, **{_cache_name(out): cache})


def _cache_name(output) -> str:
    return "cache" if "cache" in type(output).__dataclass_fields__ else "past_key_values"


@pytest.mark.parametrize("position_ids,match", [
    ([[1, 2, 3, 4]], "restarts"),            # does not start at 0
    ([[0, 1, 3, 4]], "restarts"),            # skips a position
    ([[0, 1], [0, 1]], "shape"),             # wrong shape
])
def test_bad_position_ids_are_refused(position_ids, match):
    model = build(TnnForMaskedLM, "dense")
    with pytest.raises(ValueError, match=f"position_ids.*{match}|{match}"):
        model(input_ids=torch.tensor([[5, 6, 7, 8]]), position_ids=torch.tensor(position_ids))


def test_inconsistent_packing_keywords_are_refused():
    model = build(TnnForMaskedLM, "dense")
    batch = packed(documents(), return_flash_attn_kwargs=True, return_seq_idx=True)
    with pytest.raises(ValueError, match="max_length_q"):
        model(**{**batch, "max_length_q": 3})
    with pytest.raises(ValueError, match="mark different documents"):
        model(**{**batch, "seq_idx": torch.zeros_like(batch["seq_idx"])})
    with pytest.raises(ValueError, match="cu_seq_lens_q and cu_seq_lens_k"):
        model(**{**batch, "cu_seq_lens_k": batch["cu_seq_lens_k"] * 0 + torch.arange(6) * 5 + 3})
    with pytest.raises(ValueError, match="padding"):
        model(**batch, attention_mask=torch.cat([torch.ones(1, 27), torch.zeros(1, 1)], 1).long())


@pytest.mark.parametrize("model_class", [TnnModel, TnnForCausalLM, TnnForMaskedLM, TnnForSequenceClassification,
                                         TnnForTokenClassification, TnnForQuestionAnswering])
def test_unknown_keywords_raise_a_type_error_naming_them(model_class):
    model = build(model_class, "dense")
    ids = torch.tensor([[5, 6, 7]])
    with pytest.raises(TypeError, match="token_type_idz"):
        model(input_ids=ids, token_type_idz=ids)
    with pytest.raises(ValueError, match="output_attentions"):
        model(input_ids=ids, output_attentions=True)
    model(input_ids=ids, output_attentions=False, output_router_logits=None, is_causal=model.config.causal)
    if model_class is not TnnForCausalLM:
        with pytest.raises(ValueError, match="logits_to_keep"):
            model(input_ids=ids, logits_to_keep=torch.tensor([0]))
        model(input_ids=ids, logits_to_keep=0, use_cache=False)
    if model_class is TnnModel:
        with pytest.raises(TypeError, match="num_items_in_batch"):
            model(input_ids=ids, num_items_in_batch=3)


def test_num_items_in_batch_reaches_the_loss():
    model = build(TnnForCausalLM, "dense")
    ids = torch.tensor([[5, 6, 7, 8]])
    mean = model(input_ids=ids, labels=ids).loss
    summed = model(input_ids=ids, labels=ids, num_items_in_batch=torch.tensor(1)).loss
    torch.testing.assert_close(summed, mean * 3)  # 3 predicted tokens, summed over 1 item


@torch.no_grad()
def test_generate_position_ids_under_left_padding_and_beams_are_not_documents():
    model = build(TnnForCausalLM, "dense").float()
    model.generation_config.pad_token_id = 0
    prompts = [torch.tensor([5, 6, 7, 8, 9]), torch.tensor([11, 12])]
    ids = torch.zeros(2, 5, dtype=torch.long)
    mask = torch.zeros(2, 5, dtype=torch.long)
    for row, prompt in enumerate(prompts):
        ids[row, 5 - len(prompt):], mask[row, 5 - len(prompt):] = prompt, 1
    seen = []
    hook = model.register_forward_pre_hook(lambda m, a, kw: seen.append(kw.get("position_ids")), with_kwargs=True)
    for beams in (1, 2):
        options = {"max_new_tokens": 4, "do_sample": False, "num_beams": beams}
        batch = model.generate(input_ids=ids, attention_mask=mask, **options)[:, 5:]
        alone = [model.generate(input_ids=p[None], **options)[0, len(p):] for p in prompts]
        assert batch.tolist() == [a.tolist() for a in alone]
    hook.remove()
    assert any(p is not None and p.shape[1] == 5 for p in seen)  # generate builds and passes them
    first = model(ids, attention_mask=mask, use_cache=True)  # a continuation under left padding
    step = model(torch.tensor([[3], [4]]), attention_mask=torch.cat([mask, torch.ones(2, 1, dtype=torch.long)], 1),
                 position_ids=torch.tensor([[5], [2]]), use_cache=True,
                 **{_cache_name(first): getattr(first, _cache_name(first))})
    full = [model(torch.cat([p, torch.tensor([t])])[None]).logits[0, -1] for p, t in zip(prompts, (3, 4))]
    torch.testing.assert_close(step.logits[:, -1], torch.stack(full), rtol=1e-4, atol=1e-4)


RIGHT_PADDED_MASK = [[1, 1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 0, 0, 0], [1, 0, 0, 0, 0, 0, 0]]


def _right_padding_warnings(model, ids, mask, **options) -> list[str]:
    """The lines transformers' generate logs for a right-padded batch."""
    logger = transformers_logging.get_logger("transformers.generation.utils")
    with CaptureLogger(logger) as captured:
        model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=4, do_sample=False, **options)
    return [line for line in captured.out.splitlines() if "right-padding was detected" in line]


@torch.no_grad()
def test_generate_under_right_padding_runs_and_warns_as_llama_does():
    """A tokenizer padding on the right (many do by default) gives generate a mask with zeros at the end of rows: a
    documented user error for a decoder-only model, which Llama warns of and generates through. generate numbers the
    tokens it appends one past the padding slot before them (not past the row's real tokens); TNN takes them as
    positions too, with and without the cache, and both give the same tokens."""
    model = build(TnnForCausalLM, "dense").float()
    model.generation_config.pad_token_id = 0
    mask = torch.tensor(RIGHT_PADDED_MASK)
    ids = torch.randint(1, 99, mask.shape, generator=torch.Generator().manual_seed(0)).masked_fill(mask == 0, 0)
    llama = LlamaForCausalLM(LlamaConfig(vocab_size=99, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                         num_attention_heads=2, pad_token_id=0)).eval()
    expected = _right_padding_warnings(llama, ids, mask)
    assert len(expected) == 1
    for options in ({"use_cache": False}, {"use_cache": True}, {"use_cache": False, "num_beams": 2}):
        assert _right_padding_warnings(model, ids, mask, **options) == expected, options
    greedy = {"max_new_tokens": 4, "do_sample": False}
    no_cache = model.generate(input_ids=ids, attention_mask=mask, use_cache=False, **greedy)
    cached = model.generate(input_ids=ids, attention_mask=mask, use_cache=True, **greedy)
    assert no_cache.shape == (3, 11) and torch.equal(no_cache, cached)


@pytest.mark.parametrize("position_ids", [
    [0, 1, 2, 0, 0, 1, 2],    # generate's: padding slots 0, appended tokens one past the last slot
    [0, 1, 2, 1, 1, 2, 3],    # the same with padding slots holding 1 (another fill: any number is no token)
    [0, 1, 2, 3, 4, 5, 6],    # one position per slot, padding counted
    [0, 1, 2, 9, 9, 3, 4],    # padding skipped
])
def test_positions_after_right_padding_are_accepted(position_ids):
    model = build(TnnForCausalLM, "dense").float()
    ids, mask = torch.arange(5, 12)[None], torch.tensor([[1, 1, 1, 0, 0, 1, 1]])
    plain = model(input_ids=ids, attention_mask=mask).logits
    torch.testing.assert_close(model(input_ids=ids, attention_mask=mask, position_ids=torch.tensor([position_ids])
                                     ).logits, plain)


@pytest.mark.parametrize("position_ids,mask", [
    ([0, 1, 2, 0, 1, 0, 0], [1, 1, 1, 1, 1, 0, 0]),   # a restart among real tokens, padding after
    ([0, 0, 0, 1, 0, 1, 2], [0, 0, 1, 1, 1, 1, 1]),   # a restart after left padding
    ([0, 1, 2, 0, 0, 1, 2], [1, 1, 1, 0, 1, 1, 1]),   # a document restarting after padding (one past neither)
    ([0, 1, 2, 0, 0, 2, 3], [1, 1, 1, 0, 0, 1, 1]),   # one past neither the padding slot nor the real token
])
def test_restarting_positions_under_padding_are_refused(position_ids, mask):
    model = build(TnnForCausalLM, "dense")
    with pytest.raises(ValueError, match="position_ids: under a padding attention_mask"):
        model(input_ids=torch.arange(5, 12)[None], attention_mask=torch.tensor([mask]),
              position_ids=torch.tensor([position_ids]))


def test_one_document_per_row_is_a_plain_batch():
    """position_ids 0..n-1 on every row mark nothing to separate: a head pools its padding mask as without them."""
    model = build(TnnForSequenceClassification, "dense")
    ids = torch.tensor([[5, 6, 7, 0], [8, 9, 10, 11]])
    plain = model(input_ids=ids).logits
    with_positions = model(input_ids=ids, position_ids=torch.arange(4).expand(2, 4)).logits
    torch.testing.assert_close(with_positions, plain)
    with pytest.raises(ValueError, match="not both"):
        model.model(input_ids=ids, position_ids=torch.arange(4).expand(2, 4),
                    documents=build_layout([[2, 2], [4]], 4, ids.device))


def test_generate_from_a_packed_prompt_is_refused():
    model = build(TnnForCausalLM, "dense").float()
    batch = packed(documents())
    with pytest.raises(ValueError, match="no decoding cache"):
        model.generate(input_ids=batch["input_ids"], position_ids=batch["position_ids"], max_new_tokens=2)


def test_a_traced_training_forward_refuses_packed_position_ids(monkeypatch):
    """Under torch.compile / export (no values to read) position_ids are positions of an inference graph only: a
    traced training forward that gets them is refused instead of mixing the documents it cannot lay out."""
    from modeling_tnn import input_packing

    monkeypatch.setattr(input_packing, "tracing", lambda: True)
    batch = {"position_ids": packed(documents())["position_ids"]}
    with pytest.raises(ValueError, match="torch.compile"):
        input_packing.document_layout(batch, batch=1, width=28, attention_mask=None, continues_cache=False,
                                      device=torch.device("cpu"))
    with torch.no_grad():
        assert input_packing.document_layout(batch, batch=1, width=28, attention_mask=None, continues_cache=False,
                                             device=torch.device("cpu")) is None
