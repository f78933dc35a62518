"""``--mixed_precision bf16`` in the pretraining scripts is really applied: Accelerate's autocast runs the block
projections in bfloat16 while the FFTs stay in float32 (dtypes observed inside the model), and a short run ends
within a few percent of the float32 run's loss. The fully_shard path (--fsdp on CPU processes) applies the same
autocast itself."""

from __future__ import annotations

import json
import math

import pytest
import torch
from accelerate import Accelerator
from accelerate.state import AcceleratorState, GradientState

from modeling_tnn.recipes.pretraining import arguments as lm_arguments
from modeling_tnn.recipes.pretraining import setup as lm_setup
from modeling_tnn.recipes.pretraining.sharding import _autocast_forward

from tests.support import (TINY_PRETRAINING, assert_float32_token_mixing,
                           assert_low_precision_projections_and_float32_ffts, observed_dtypes, run_pretraining,
                           tiny_config)


@pytest.mark.parametrize("mixer", ["dense", "fd"])
def test_bf16_flag_runs_projections_in_bf16_and_ffts_in_float32(tmp_path, mixer, mixer_path):
    args = lm_arguments.parse_args("clm", TINY_PRETRAINING + ["--mixed_precision", "bf16", "--config_overrides",
                                                              f"token_mixer={mixer}", "--output_dir", str(tmp_path)])
    session = lm_setup.setup(args, "clm")
    batch = next(iter(session.train_dataloader))
    # No autocast of our own: what runs in bf16 is what the prepared model's forward does.
    seen, outputs, loss = observed_dtypes(session.model, session.build_inputs(batch), autocast_dtype=None)
    assert_low_precision_projections_and_float32_ffts(seen, outputs, torch.bfloat16, uses_fft=mixer_path == "fft"
                                                      or mixer == "fd")
    assert_float32_token_mixing(seen, mixer_path)
    assert torch.isfinite(loss)


@pytest.mark.slow
def test_bf16_run_ends_within_a_few_percent_of_float32(tmp_path):
    common = TINY_PRETRAINING + ["--max_train_steps", "30", "--learning_rate", "3e-3",
                                 "--per_device_train_batch_size", "4"]
    results = {}
    for precision in ("no", "bf16"):
        run_pretraining("clm", common + ["--mixed_precision", precision, "--output_dir", str(tmp_path / precision)])
        results[precision] = json.loads((tmp_path / precision / "all_results.json").read_text())
    assert results["bf16"]["eval_loss"] == pytest.approx(results["no"]["eval_loss"], rel=0.03)
    assert results["bf16"]["train_loss"] == pytest.approx(results["no"]["train_loss"], rel=0.03)
    assert results["no"]["eval_loss"] < math.log(300) - 1  # the run learned something (uniform: ln 300)


def test_fully_shard_path_applies_accelerates_autocast():
    from modeling_tnn import TnnForCausalLM

    AcceleratorState._reset_state(reset_partial_state=True)
    try:
        accelerator = Accelerator(cpu=True, mixed_precision="bf16")
        model = TnnForCausalLM(tiny_config("dense"))
        _autocast_forward(model, accelerator)
        ids = torch.randint(1, 128, (2, 37))
        seen, outputs, _ = observed_dtypes(model, {"input_ids": ids, "labels": ids}, autocast_dtype=None)
        assert_low_precision_projections_and_float32_ffts(seen, outputs, torch.bfloat16, uses_fft=True)
    finally:
        AcceleratorState._reset_state(reset_partial_state=True)
        GradientState._reset_state()
