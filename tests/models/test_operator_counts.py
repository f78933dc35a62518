"""The operators a training step records: TNN's forward + backward within 1.5x transformers' GPT-2's on both mixer
paths, the FFT one at the small-GPT size and the direct product (the training benchmark's ``--count_ops``, counted as
an accelerator would launch them), and the dropout that records nothing where it is the identity."""

from __future__ import annotations

import pytest
import torch
from modeling_tnn.ops_dispatch import use_direct
from modeling_tnn.tnn_block import Dropout
from modeling_tnn.recipes.benchmarks import training as bench
from modeling_tnn.recipes.benchmarks import training_models
from modeling_tnn.recipes.benchmarks.op_count import aten_events


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
