"""Model-level behaviour of every head: causality, exact padding, losses, checkpointing, init, determinism."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from transformers import AutoModelForCausalLM

from modeling_tnn import TnnForCausalLM, TnnForMaskedLM, TnnForSequenceClassification, TnnModel
from modeling_tnn.decoding_cache import TnnCache

from tests.support import (CAUSAL_MIXERS, MIXERS, assert_padded_rows_equal_rows_alone, loss_and_grads, main_output,
                           padded_batch, random_rows, tiny_config, with_mixers)

@pytest.mark.parametrize("mixer", CAUSAL_MIXERS)
@pytest.mark.parametrize("cls", [TnnModel, TnnForCausalLM])
def test_causal_models_never_look_ahead(cls, mixer):
    model = cls(tiny_config(mixer)).double().eval()  # float64: FFT round-off stays far below the tolerance
    ids = torch.randint(1, 128, (2, 40))
    changed = ids.clone()
    p = 23
    changed[:, p + 1:] = torch.randint(1, 128, (2, 40 - p - 1))
    with torch.no_grad():
        a, b = main_output(model(input_ids=ids)), main_output(model(input_ids=changed))
    torch.testing.assert_close(a[:, : p + 1], b[:, : p + 1], atol=1e-10, rtol=0)
    assert not torch.allclose(a[:, p + 1:], b[:, p + 1:])


@pytest.mark.parametrize("cls, side, causal, mixer", with_mixers([
    (TnnModel, "left", True),
    (TnnModel, "right", False),
    (TnnForCausalLM, "left", True),
    (TnnForMaskedLM, "right", False),
]))
def test_padded_batch_equals_each_row_alone(cls, side, causal, mixer):
    model = cls(tiny_config(mixer, causal=causal)).eval()
    assert_padded_rows_equal_rows_alone(model, random_rows(), side)


@pytest.mark.parametrize("side, causal, mixer", with_mixers([("right", False), ("left", True), ("right", True)]))
def test_sequence_classification_padding_is_exact(side, causal, mixer):
    model = TnnForSequenceClassification(tiny_config(mixer, causal=causal, num_labels=3)).eval()
    rows = random_rows()
    ids, mask = padded_batch(rows, side)
    with torch.no_grad():
        batch = model(input_ids=ids, attention_mask=mask).logits
        alone = torch.cat([model(input_ids=row[None]).logits for row in rows])
    torch.testing.assert_close(batch, alone, atol=1e-5, rtol=1e-5)


def test_classification_mask_defaults_to_pad_token():
    model = TnnForSequenceClassification(tiny_config(num_labels=2)).eval()
    ids, mask = padded_batch(random_rows(), "right")
    with torch.no_grad():
        torch.testing.assert_close(model(input_ids=ids).logits, model(input_ids=ids, attention_mask=mask).logits)


def test_causal_lm_loss_matches_shifted_cross_entropy():
    model = TnnForCausalLM(tiny_config()).eval()
    ids = torch.randint(1, 128, (2, 16))
    out = model(input_ids=ids, labels=ids)
    expected = F.cross_entropy(out.logits[:, :-1].reshape(-1, 128), ids[:, 1:].reshape(-1))
    torch.testing.assert_close(out.loss, expected)
    # Trainer passes num_items_in_batch for gradient accumulation: the loss becomes sum / num_items.
    summed = F.cross_entropy(out.logits[:, :-1].reshape(-1, 128), ids[:, 1:].reshape(-1), reduction="sum")
    out_n = model(input_ids=ids, labels=ids, num_items_in_batch=torch.tensor(100))
    torch.testing.assert_close(out_n.loss, summed / 100)


def test_masked_lm_loss_ignores_unmasked_positions():
    model = TnnForMaskedLM(tiny_config()).eval()
    ids = torch.randint(1, 128, (2, 16))
    labels = torch.full_like(ids, -100)
    labels[:, 3] = ids[:, 3]
    out = model(input_ids=ids, labels=labels)
    torch.testing.assert_close(out.loss, F.cross_entropy(out.logits[:, 3], ids[:, 3]))


@pytest.mark.parametrize("problem_type, num_labels, make_labels, loss_fn", [
    ("regression", 1, lambda: torch.randn(4), lambda logits, y: F.mse_loss(logits.squeeze(-1), y)),
    ("single_label_classification", 3, lambda: torch.randint(0, 3, (4,)), F.cross_entropy),
    ("multi_label_classification", 3, lambda: torch.randint(0, 2, (4, 3)).float(),
     F.binary_cross_entropy_with_logits),
])
def test_sequence_classification_problem_types(problem_type, num_labels, make_labels, loss_fn):
    model = TnnForSequenceClassification(tiny_config(num_labels=num_labels, problem_type=problem_type)).eval()
    labels = make_labels()
    out = model(input_ids=torch.randint(1, 128, (4, 10)), labels=labels)
    assert out.logits.shape == (4, num_labels)
    torch.testing.assert_close(out.loss, loss_fn(out.logits, labels))


@pytest.mark.parametrize("mixer", MIXERS)
def test_activation_checkpointing_gives_same_loss_and_gradients(mixer):
    torch.manual_seed(0)
    model = TnnForMaskedLM(tiny_config(mixer, dropout=0.1)).train()
    ids = torch.randint(1, 128, (2, 24))
    torch.manual_seed(1)  # the same dropout masks in both runs
    loss_plain, grads_plain = loss_and_grads(model, ids)
    # activation_checkpointing_enable: transformers' name since 5.23 (gradient_checkpointing_enable is deprecated)
    model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    assert model.is_activation_checkpointing and all(layer.gradient_checkpointing for layer in model.model.layers)
    torch.manual_seed(1)
    loss_ckpt, grads_ckpt = loss_and_grads(model, ids)
    torch.testing.assert_close(loss_plain, loss_ckpt)
    assert grads_plain.keys() == grads_ckpt.keys()
    for name, grad in grads_plain.items():
        torch.testing.assert_close(grads_ckpt[name], grad, msg=name)


@pytest.mark.parametrize("mixer", CAUSAL_MIXERS)
def test_bf16_autocast_forward_is_finite(mixer):
    model = TnnForCausalLM(tiny_config(mixer)).eval()
    with torch.autocast("cpu", dtype=torch.bfloat16), torch.no_grad():
        logits = model(input_ids=torch.randint(1, 128, (2, 33))).logits
    assert torch.isfinite(logits.float()).all()


def test_bfloat16_model_forward_is_finite():
    model = TnnForCausalLM(tiny_config()).to(torch.bfloat16).eval()
    with torch.no_grad():
        logits = model(input_ids=torch.randint(1, 128, (2, 33))).logits
    assert logits.dtype == torch.bfloat16 and torch.isfinite(logits.float()).all()


@pytest.mark.parametrize("cls", [TnnModel, TnnForCausalLM, TnnForMaskedLM, TnnForSequenceClassification])
def test_eval_is_deterministic_and_tuples_equal_dicts(cls):
    model = cls(tiny_config(dropout=0.1, output_hidden_states=True)).eval()
    ids = torch.randint(1, 128, (2, 20))
    with torch.no_grad():
        first = model(input_ids=ids)
        second = model(input_ids=ids)
        as_tuple = model(input_ids=ids, return_dict=False)
    def assert_same(a, b):
        if isinstance(a, TnnCache):  # a causal model returns its decoding state by default in eval mode
            assert a.get_seq_length() == b.get_seq_length()
            for x, y in zip(a.layers, b.layers):
                torch.testing.assert_close(x.recurrent_states[0], y.recurrent_states[0], atol=0, rtol=0)
        elif isinstance(a, tuple):
            for x, y in zip(a, b):
                torch.testing.assert_close(x, y, atol=0, rtol=0)
        else:
            torch.testing.assert_close(a, b, atol=0, rtol=0)

    for a, b in zip(first.to_tuple(), second.to_tuple()):
        assert_same(a, b)
    assert isinstance(as_tuple, tuple) and len(as_tuple) == len(first.to_tuple())
    for a, b in zip(first.to_tuple(), as_tuple):
        assert_same(a, b)


def test_hidden_states_have_one_entry_per_layer_plus_output():
    model = TnnModel(tiny_config()).eval()
    out = model(input_ids=torch.randint(1, 128, (1, 5)), output_hidden_states=True)
    assert len(out.hidden_states) == model.config.num_hidden_layers + 1


def test_rpe_starts_non_degenerate_through_from_config():
    # transformers' default init (zero biases) would leave the RPE with three distinct outputs per channel.
    model = AutoModelForCausalLM.from_config(tiny_config())
    mixer = model.model.layers[0].gtu.token_mixer
    with torch.no_grad():
        values = mixer.rpe(torch.arange(-30, 31))
    distinct = [len(torch.unique(values[:, c].round(decimals=6))) for c in range(values.shape[1])]
    assert min(distinct) > 20
    assert all(layer.bias.abs().sum() > 0 for layer in mixer.rpe.layers)


def test_bad_attention_mask_shape_raises():
    model = TnnModel(tiny_config())
    with pytest.raises(ValueError, match="attention_mask"):
        model(input_ids=torch.ones(2, 5, dtype=torch.long), attention_mask=torch.ones(2, 1, 5, 5))


def test_greedy_generate_without_cache_matches_argmax_loop():
    model = TnnForCausalLM(tiny_config(eos_token_id=None)).eval()
    prompt = torch.randint(1, 128, (1, 6))
    out = model.generate(prompt, max_new_tokens=5, do_sample=False, use_cache=False)
    ids = prompt
    with torch.no_grad():
        for _ in range(5):
            ids = torch.cat([ids, model(input_ids=ids).logits[:, -1:].argmax(-1)], dim=1)
    assert torch.equal(out, ids)
