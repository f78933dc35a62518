"""What the serving tests share: vLLM's venv (``make vllm-install``; the tests skip, saying so, only where it is not
installed), saved TNN folders, running vllm_generate.py there, and transformers' reference on what vLLM generated.
The test modules start their vLLM processes at the session's first test (support.AT_SESSION_START)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import torch

from modeling_tnn import TnnForCausalLM
from tests.support import PROJECT_ROOT, Started, tiny_config

from .vllm_generate import FOLDER_MARK

VLLM_VENV = PROJECT_ROOT / ".venv-vllm"
VLLM_PYTHON = VLLM_VENV / "bin" / "python"
# As the check runs it: offline, a 2 GiB state budget; one OpenMP thread (the tests share 2 cores).
VLLM_ENV = {"HF_HUB_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "2", "OMP_NUM_THREADS": "1",
            "TOKENIZERS_PARALLELISM": "false"}
# A continuous batch: fewer running requests than prompts, and chunks of at most 256 prompt tokens.
ENGINE = {"max_num_seqs": 4, "max_num_batched_tokens": 256}
TOLERANCE = 1e-3


def require_vllm() -> Path:
    if not (VLLM_VENV / ".installed").is_file():  # written by `make vllm-install` once its install check passed
        pytest.skip("vLLM's venv .venv-vllm is not installed: `make vllm-install` builds it (the serving tests run "
                    "there)")
    return VLLM_PYTHON


def vllm_environment() -> dict[str, str]:
    return {**os.environ, **VLLM_ENV}


def save_folder(folder: Path, token_mixer: str, with_plan: bool, model_class: type = TnnForCausalLM,
                vocab_size: int = 256) -> Path:
    """A tiny TNN saved to ``folder``. Its branches (and FD's kernel) are scaled up (random weights otherwise mostly
    repeat the last token), so that the greedy choices depend on the context and a wrong state shows in them."""
    torch.manual_seed(0)
    model = model_class(tiny_config(token_mixer, vocab_size=vocab_size, pad_token_id=None, eos_token_id=None)).eval()
    with torch.no_grad():
        for block in model.model.layers:
            block.gtu.o_proj.weight.mul_(8)
            block.glu.down_proj.weight.mul_(3)
            if token_mixer == "fd":
                block.gtu.token_mixer.rpe.out_proj.weight.mul_(20)
    if with_plan:
        model.fit_decoding_plan()
    model.save_pretrained(folder)
    return folder


def start_vllm(folders: list[tuple[Path, list[dict]]], workdir: Path, engine: dict | None = None) -> Started:
    """vllm_generate.py on each of ``folders`` in turn with its runs (prompts and sampling parameters each), from
    ``workdir`` (outside the repository, as a user runs it); its results go to ``workdir / "results.json"``, its
    output (vLLM's log and tracebacks, in the order written) to ``workdir / "vllm.log"``."""
    spec = workdir / "spec.json"
    spec.write_text(json.dumps({"engine": ENGINE if engine is None else engine,
                                "folders": [{"folder": str(folder), "runs": runs} for folder, runs in folders]}))
    log = workdir / "vllm.log"
    with open(log, "w") as output:  # a file, not a pipe: nobody reads the output until the process ends
        process = subprocess.Popen([str(require_vllm()), str(Path(__file__).with_name("vllm_generate.py")),
                                    str(spec), str(workdir / "results.json")], cwd=workdir, env=vllm_environment(),
                                   stdout=output, stderr=subprocess.STDOUT)
    return Started(process, log, {"workdir": workdir})


def results(started: Started, timeout: float = 600) -> tuple[list[dict], str]:
    """Once vllm_generate.py ends: one entry a folder (its runs' requests, or the error its engine's start raised),
    and its output."""
    started.process.wait(timeout=timeout)
    output = started.log.read_text()
    assert started.process.returncode == 0, output[-6000:]
    return json.loads((started.inputs["workdir"] / "results.json").read_text())["folders"], output


def folder_logs(output: str) -> list[str]:
    """The output of each folder's engine (vLLM's processes for one folder end before the next folder's start)."""
    return output.split(FOLDER_MARK)[1:]


def teacher_forced_gaps(model: torch.nn.Module, prompt: list[int], generated: list[int],
                        logprobs: list[float]) -> list[tuple[float, float]]:
    """Per generated token, transformers' no-cache forward on ``prompt + generated``: (|its logprob of the token -
    vLLM's|, how much more likely transformers' best token is than the chosen one)."""
    with torch.no_grad():
        rows = model(torch.tensor([prompt + generated]), use_cache=False).logits[0].float().log_softmax(-1)
    gaps = []
    for step, (token, logprob) in enumerate(zip(generated, logprobs)):
        row = rows[len(prompt) - 1 + step]
        gaps.append((abs(row[token].item() - logprob), row.max().item() - row[token].item()))
    return gaps


def load_reference(folder: Path) -> torch.nn.Module:
    return TnnForCausalLM.from_pretrained(folder).eval()

