"""The tokenizer a causal-LM recipe saves pads on the left (transformers' decoder-only convention), so the obvious
batched ``generate(**tokenizer(prompts, padding=True, return_tensors="pt"))`` on the saved folder gives every row the
continuation it gets alone; a masked LM's keeps padding on the right."""

from __future__ import annotations

import warnings

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from modeling_tnn.recipes.pretraining import arguments as lm_arguments
from modeling_tnn.recipes.pretraining import training as lm_training

TINY = ["--config_name", "tiny", "--block_size", "16", "--vocab_size", "300", "--report_to", "none",
        "--max_eval_samples", "8", "--per_device_eval_batch_size", "8", "--max_train_steps", "2",
        "--per_device_train_batch_size", "4"]


def _train(task: str, folder, *flags: str) -> None:
    lm_training.run(lm_arguments.parse_args(task, [*TINY, "--output_dir", str(folder), *flags]), task)


def test_a_causal_lm_s_saved_tokenizer_pads_left_and_batched_generate_matches_one_by_one(tmp_path):
    _train("clm", tmp_path / "clm")
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "clm")
    assert tokenizer.padding_side == "left"
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "clm", trust_remote_code=True).eval()
    prompts = ["The assert statement is", "A"]
    greedy = dict(max_new_tokens=6, do_sample=False, pad_token_id=tokenizer.pad_token_id)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # transformers warns of right padding in a decoder-only batch
        batch = tokenizer(prompts, padding=True, return_tensors="pt")
        out = model.generate(**batch, **greedy)
    for row, prompt in enumerate(prompts):
        alone = model.generate(**tokenizer(prompt, return_tensors="pt"), **greedy)
        assert torch.equal(out[row, -6:], alone[0, -6:]), prompt

    # A tokenizer given by name (here the saved one, set back to right padding) is saved padding left too.
    tokenizer.padding_side = "right"
    tokenizer.save_pretrained(tmp_path / "right")
    _train("clm", tmp_path / "named", "--tokenizer_name", str(tmp_path / "right"))
    assert AutoTokenizer.from_pretrained(tmp_path / "named").padding_side == "left"


def test_a_masked_lm_s_saved_tokenizer_pads_right(tmp_path):
    _train("mlm", tmp_path / "mlm")
    assert AutoTokenizer.from_pretrained(tmp_path / "mlm").padding_side == "right"
