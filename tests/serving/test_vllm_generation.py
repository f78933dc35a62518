"""The model inside vLLM (vLLM's venv, a subprocess each): under continuous batching (4 running requests of 14,
prompts prefilled in chunks of 256 tokens) greedy decoding of prompts from 1 to 2,000 tokens picks transformers'
greedy tokens with its logprobs; a prompt alone gives what it gave among others; seeded sampling repeats. Dense with
the plan saved beside the weights, FD saved without one. The bidirectional heads are refused, saying why."""

from __future__ import annotations

import random

import pytest

from modeling_tnn import TnnForMaskedLM

from .harness import TOLERANCE, load_reference, require_vllm, results, run_vllm, save_folder, teacher_forced_gaps

pytestmark = pytest.mark.slow

LENGTHS = (1, 2, 3, 7, 33, 64, 255, 256, 257, 700, 1024, 1300, 1999, 2000)
GREEDY = {"max_tokens": 24, "temperature": 0, "logprobs": 1, "ignore_eos": True}
SEEDED = {"max_tokens": 12, "temperature": 1.0, "top_p": 0.9, "seed": 1234, "ignore_eos": True}


def _prompts() -> list[list[int]]:
    generator = random.Random(0)
    return [[generator.randrange(1, 256) for _ in range(length)] for length in LENGTHS]


@pytest.fixture(scope="module", params=[("dense", True), ("fd", False)], ids=["dense-with-plan", "fd-without-plan"])
def served(request, tmp_path_factory):
    """A folder, the prompts and vLLM's outputs: all prompts greedy together, the longest and the shortest alone,
    the seeded sampling twice."""
    require_vllm()
    token_mixer, with_plan = request.param
    workdir = tmp_path_factory.mktemp(f"vllm-{token_mixer}")
    folder = save_folder(workdir / "model", token_mixer, with_plan)
    prompts = _prompts()
    runs = [{"prompts": prompts, "sampling": GREEDY}, {"prompts": [prompts[-1]], "sampling": GREEDY},
            {"prompts": [prompts[0]], "sampling": GREEDY}, {"prompts": prompts[:6], "sampling": SEEDED},
            {"prompts": prompts[:6], "sampling": SEEDED}]
    completed = run_vllm(folder, runs, workdir)
    return folder, prompts, results(completed, workdir), completed.stdout + completed.stderr  # vLLM logs to stdout


def test_greedy_tokens_are_transformers_choices(served):
    folder, prompts, outputs, _ = served
    model = load_reference(folder)
    together = outputs["runs"][0]["requests"]
    assert len(together) == len(prompts)
    for prompt, request in zip(prompts, together):
        assert len(request["tokens"]) == GREEDY["max_tokens"]
        gaps = teacher_forced_gaps(model, prompt, request["tokens"], request["logprobs"])
        logprob_gap, best_margin = max(g[0] for g in gaps), max(g[1] for g in gaps)
        assert logprob_gap <= TOLERANCE, f"prompt of {len(prompt)}: logprob off by {logprob_gap:.2e}"
        assert best_margin <= TOLERANCE, f"prompt of {len(prompt)}: another token was {best_margin:.2e} more likely"
    # The greedy tokens depend on the context (a model that repeats its last token would not test the states).
    assert len({tuple(request["tokens"]) for request in together}) == len(prompts)


def test_a_prompt_alone_gives_what_it_gave_among_others(served):
    _, _, outputs, _ = served
    together = outputs["runs"][0]["requests"]
    assert outputs["runs"][1]["requests"][0]["tokens"] == together[-1]["tokens"]
    assert outputs["runs"][2]["requests"][0]["tokens"] == together[0]["tokens"]
    for alone, among in ((outputs["runs"][1]["requests"][0], together[-1]),
                         (outputs["runs"][2]["requests"][0], together[0])):
        assert max(abs(a - b) for a, b in zip(alone["logprobs"], among["logprobs"])) <= TOLERANCE


def test_seeded_sampling_repeats(served):
    _, _, outputs, _ = served
    first, second = outputs["runs"][3]["requests"], outputs["runs"][4]["requests"]
    assert [r["tokens"] for r in first] == [r["tokens"] for r in second]
    greedy = [r["tokens"][:SEEDED["max_tokens"]] for r in outputs["runs"][0]["requests"][:6]]
    assert [r["tokens"] for r in first] != greedy  # it did sample


def test_the_plan_comes_from_the_folder(served):
    folder, _, _, log = served
    assert ("fitting the decoding plan" in log) is False  # dense ships its plan; FD's exact window needs none
    assert "TNN decoding states per request" in log


def test_masked_lm_folder_is_refused_saying_why(tmp_path):
    require_vllm()
    folder = save_folder(tmp_path / "mlm", "dense", False, model_class=TnnForMaskedLM)
    completed = run_vllm(folder, [], tmp_path)
    assert completed.returncode != 0
    log = completed.stdout + completed.stderr
    assert "refuses this folder" in log and "not a causal language model" in log
