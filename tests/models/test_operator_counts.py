"""The operators a training step records: TNN's forward + backward within 1.5x transformers' GPT-2's on both mixer
paths, the FFT one at the small-GPT size and the direct product (the training benchmark's ``--count_ops``, counted as
an accelerator would launch them), the dropout that records nothing where it is the identity, and the operators of a
decode step between folds, counted."""

from __future__ import annotations

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

from modeling_tnn import TnnForCausalLM
from modeling_tnn.modeling_tnn import CACHE_FIELD  # the output's cache field: its name differs between releases
from modeling_tnn.ops_dispatch import use_direct
from modeling_tnn.tnn_block import Dropout
from modeling_tnn.recipes.benchmarks import training as bench
from modeling_tnn.recipes.benchmarks import training_models
from modeling_tnn.recipes.benchmarks.op_count import aten_events

from tests.support import tiny_config


@pytest.mark.parametrize("p, training", [(0.0, True), (0.3, False)])
def test_dropout_records_nothing_where_it_is_the_identity(p, training):
    dropout = Dropout(p).train(training)
    x = torch.randn(4, 8)
    assert dropout(x) is x
    assert aten_events(lambda: dropout(x)) == (0, {})


def test_dropout_still_drops_in_training():
    torch.manual_seed(0)
    out = Dropout(0.5).train()(torch.ones(1000))
    assert set(out.unique().tolist()) == {0.0, 2.0}


@pytest.mark.slow
@pytest.mark.parametrize("argv, direct", [
    (["--suite", "small_gpt"], False),  # batch 12 < n / 2: the FFT path
    (["--families", "causal", "--lengths", "64", "--tokens", "2048", "--hidden_size", "128"], True),  # batch 32
], ids=["small_gpt_fft_path", "direct_path"])
def test_step_records_at_most_one_and_a_half_times_gpt2s_operators(argv, direct):
    args = bench.parse_args([*argv, "--models", "tnn-dense,gpt2", "--count_ops"])
    config = training_models.tnn_config(args, "causal", "dense")
    assert use_direct(training_models.batch_for(args, 64), 64, config.gtu_dim) is direct
    rows = {row["model"]: row for row in bench.count_ops(args)}
    tnn, gpt2 = rows["tnn-dense"]["forward_backward_one_chunk"], rows["gpt2"]["forward_backward_one_chunk"]
    assert tnn <= 1.5 * gpt2, f"TNN records {tnn} aten ops forward + backward, GPT-2 {gpt2}: {tnn / gpt2:.3f}x"


# A decode step between folds, per layer: two norms (3 each), one silu and a chunk per GTU and GLU, the state's view
# of its row and table rows, its addcmul_ and the output row (a slice and its clone), two gating products and two
# residual adds; per step: the embedding, its scale, the final norm and the cache's counter.
DECODE_OPS_PER_LAYER, DECODE_OPS_PER_STEP = 18, 4


def test_a_decode_step_records_its_counted_operators_besides_the_linear_calls():
    """At batch 1 a step is bound by its operator calls (each pays a cold start after a Linear's weight stream): one
    more per layer is a regression this catches."""
    torch.manual_seed(0)
    config = tiny_config("dense", decay_gamma=0.9, generation_cache="compact")
    model = TnnForCausalLM(config).eval()
    ids = torch.randint(0, config.vocab_size, (1, 96))
    with torch.no_grad():
        cache = getattr(model(ids, use_cache=True), CACHE_FIELD)
        plan, token = cache.layers[0].state, ids[:, -1:]
        assert plan.capacity + plan.fold_every < ids.shape[1]  # the ring is full: no partial read
        model(token, cache=cache)  # the plan's views are made at the first step
        while (cache.get_seq_length() + 1 - plan.capacity) % plan.fold_every == 0:
            model(token, cache=cache)
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            model(token, cache=cache)
    names = [event.name for event in prof.events() if event.cpu_parent is None]
    others = len(names) - names.count("aten::linear")
    assert others <= DECODE_OPS_PER_LAYER * config.num_hidden_layers + DECODE_OPS_PER_STEP, names
