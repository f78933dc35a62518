"""The model inside vLLM (vLLM's venv, one subprocess starting an engine on each folder in turn): under continuous
batching (4 running requests of 14, prompts prefilled in chunks of 256 tokens) greedy decoding of prompts from 1 to
2,000 tokens picks transformers' greedy tokens with its logprobs; a prompt alone gives what it gave among others;
seeded sampling repeats. Dense with the plan saved beside the weights, FD saved without one. The bidirectional heads
are refused, saying why."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from modeling_tnn import TnnForMaskedLM

from tests.support import AT_SESSION_START, Started

from .harness import (TOLERANCE, folder_logs, load_reference, results, save_folder, start_vllm,
                      teacher_forced_gaps)

pytestmark = pytest.mark.slow

LENGTHS = (1, 2, 3, 7, 33, 64, 255, 256, 257, 700, 1024, 1300, 1999, 2000)
GREEDY = {"max_tokens": 24, "temperature": 0, "logprobs": 1, "ignore_eos": True}
SEEDED = {"max_tokens": 12, "temperature": 1.0, "top_p": 0.9, "seed": 1234, "ignore_eos": True}


def _prompts() -> list[list[int]]:
    generator = random.Random(0)
    return [[generator.randrange(1, 256) for _ in range(length)] for length in LENGTHS]


# The served folders by test id: (token mixer, saved with its decoding plan).
SERVED = {"dense-with-plan": ("dense", True), "fd-without-plan": ("fd", False)}
MASKED_LM = "masked-lm"


@AT_SESSION_START.register("vllm_outputs")
def start_generation(request: pytest.FixtureRequest) -> Started:
    """One vLLM process for the served folders and the masked-LM one (each process spends ~10 s importing vLLM
    before its engines start). Each served folder: all prompts greedy together, the longest and the shortest alone,
    the seeded sampling twice."""
    workdir = request.getfixturevalue("tmp_path_factory").mktemp("vllm")
    prompts = _prompts()
    runs = [{"prompts": prompts, "sampling": GREEDY}, {"prompts": [prompts[-1]], "sampling": GREEDY},
            {"prompts": [prompts[0]], "sampling": GREEDY}, {"prompts": prompts[:6], "sampling": SEEDED},
            {"prompts": prompts[:6], "sampling": SEEDED}]
    folders = {name: save_folder(workdir / name, token_mixer, with_plan)
               for name, (token_mixer, with_plan) in SERVED.items()}
    folders[MASKED_LM] = save_folder(workdir / MASKED_LM, "dense", False, model_class=TnnForMaskedLM)
    started = start_vllm([(folder, [] if name == MASKED_LM else runs) for name, folder in folders.items()], workdir)
    started.inputs.update(folders=folders, prompts=prompts)
    return started


@pytest.fixture(scope="module")
def vllm_outputs(started_at_session_start,
                 request: pytest.FixtureRequest) -> dict[str, tuple[Path, list[list[int]], dict, str]]:
    """By folder: the folder, the prompts, vLLM's outputs (or the error its engine's start raised) and the log of its
    engine."""
    started = AT_SESSION_START.take("vllm_outputs", started_at_session_start, request)
    folders, prompts = started.inputs["folders"], started.inputs["prompts"]
    outputs, output = results(started)
    logs = folder_logs(output)
    assert len(outputs) == len(logs) == len(folders), output[-6000:]
    return {name: (folder, prompts, folder_outputs, log)
            for (name, folder), folder_outputs, log in zip(folders.items(), outputs, logs)}


@pytest.fixture(scope="module", params=list(SERVED))
def served(request, vllm_outputs):
    """A served folder, the prompts, vLLM's outputs and its engine's log."""
    folder, prompts, outputs, log = vllm_outputs[request.param]
    assert "error" not in outputs, outputs["error"][-6000:]
    return folder, prompts, outputs, log


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


def test_masked_lm_folder_is_refused_saying_why(vllm_outputs):
    _, _, outputs, log = vllm_outputs[MASKED_LM]
    assert "runs" not in outputs  # its engine did not start
    for said in (outputs["error"], log):
        assert "refuses this folder" in said and "not a causal language model" in said
