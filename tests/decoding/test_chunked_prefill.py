"""Long prompts in chunks: generate's chunked prefill (``prefill_chunk_size``) gives the one-shot prefill's tokens,
a prompt continued chunk by chunk gives the no-cache forward's logits, bad chunk sizes are refused, a forward that
fails part way leaves no cache a later call reads, and a decoding step never synchronises with the host."""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from modeling_tnn import TnnForCausalLM
from modeling_tnn.mixer_base import TokenMixer
from modeling_tnn.modeling_tnn import CACHE_FIELD

from tests.support import CAUSAL_MIXERS, padded_batch, random_rows, tiny_model

GREEDY = dict(max_new_tokens=6, do_sample=False, pad_token_id=0, return_dict_in_generate=True, output_logits=True)


def _model(mixer):
    return tiny_model(mixer, TnnForCausalLM, decay_gamma=0.9).eval()


@pytest.mark.parametrize("mixer", CAUSAL_MIXERS)
def test_generate_with_prefill_chunks_gives_the_one_shot_tokens(mixer):
    model = _model(mixer)
    ids, mask = padded_batch(random_rows(lengths=(70, 45)), side="left")
    with torch.no_grad():
        whole = model.generate(ids, attention_mask=mask, **GREEDY)
        chunked = model.generate(ids, attention_mask=mask, prefill_chunk_size=16, **GREEDY)
    assert torch.equal(chunked.sequences, whole.sequences)
    for a, b in zip(chunked.logits, whole.logits):
        torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("mixer", CAUSAL_MIXERS)
def test_a_prompt_continued_chunk_by_chunk_equals_the_no_cache_forward(mixer):
    model = _model(mixer)
    ids = torch.randint(1, 128, (2, 150), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        reference = model(ids, use_cache=False).logits
        out = model(ids[:, :40], use_cache=True)
        logits = [out.logits]
        for start in range(40, 150, 37):
            out = model(ids[:, start:start + 37], **{CACHE_FIELD: getattr(out, CACHE_FIELD)})
            logits.append(out.logits)
    torch.testing.assert_close(torch.cat(logits, 1), reference, atol=1e-4 * reference.abs().max(), rtol=0)


@pytest.mark.parametrize("size", [0, -4, 2.5, True, "64"])
def test_a_chunk_size_that_is_not_a_positive_integer_is_refused(size):
    model = _model("dense")
    with pytest.raises(ValueError, match="prefill_chunk_size"):
        model.generate(torch.randint(1, 128, (1, 20)), prefill_chunk_size=size, max_new_tokens=2, pad_token_id=0)


def test_a_forward_that_fails_part_way_leaves_no_cache_a_later_call_reads(monkeypatch):
    model = _model("dense")
    ids = torch.randint(1, 128, (1, 60))
    with torch.no_grad():
        cache = getattr(model(ids[:, :20], use_cache=True), CACHE_FIELD)
        second = model.model.layers[1].gtu.token_mixer
        monkeypatch.setattr(second, "forward", lambda *args, **kwargs: (_ for _ in ()).throw(RuntimeError("boom")))
        with pytest.raises(RuntimeError, match="boom"):
            model(ids[:, 20:40], **{CACHE_FIELD: cache})  # layer 0 took the chunk, layer 1 failed
        monkeypatch.undo()
        with pytest.raises(ValueError, match="failed part way"):
            model(ids[:, 20:40], **{CACHE_FIELD: cache})
        with pytest.raises(ValueError, match="failed part way"):
            model(ids[:, 20:21], **{CACHE_FIELD: cache})
        fresh = model(ids[:, :40], use_cache=True)  # a new cache works
    assert isinstance(second, TokenMixer) and fresh.logits.shape == (1, 40, 128)


class _HostReads(TorchDispatchMode):
    """Counts the operators that read a tensor's values on the host (.item(), bool(), int(), nonzero)."""

    def __init__(self):
        super().__init__()
        self.reads = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func in (torch.ops.aten._local_scalar_dense.default, torch.ops.aten.nonzero.default,
                    torch.ops.aten.equal.default, torch.ops.aten.is_nonzero.default):
            self.reads.append(str(func))
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("mixer, mode", [("dense", "auto"), ("dense", "exact"), ("fd", "auto")])
def test_a_decoding_step_reads_no_tensor_value_on_the_host(mixer, mode, monkeypatch):
    """One token per row continuing a cache (as generate's step, or a user's call with a padding mask): no operator
    that synchronises with the device and no tolist()."""
    model = _model(mixer)
    ids, mask = padded_batch(random_rows(lengths=(30, 22)), side="left")
    with torch.no_grad():
        cache = getattr(model(ids, attention_mask=mask, use_cache=True, generation_cache=mode), CACHE_FIELD)
        mask = torch.cat([mask, torch.ones(2, 1, dtype=mask.dtype)], 1)
        token = torch.randint(1, 128, (2, 1))

        def refuse(*args, **kwargs):
            raise AssertionError("tolist() in a decoding step")
        monkeypatch.setattr(torch.Tensor, "tolist", refuse)
        with _HostReads() as reads:
            model(token, attention_mask=mask, position_ids=mask.sum(1, keepdim=True) - 1,
                  **{CACHE_FIELD: cache})
    assert reads.reads == []
