"""vLLM's OpenAI-compatible server on a saved TNN folder (vLLM's venv, started as the docs say): it answers /health,
completes 16 concurrent requests (streaming and not, mixed lengths) with the text each gives alone, answers invalid
requests with 400 and keeps serving, survives a client that drops its stream, and exits on SIGTERM."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from tests.support import AT_SESSION_START, Started

from .harness import require_vllm, save_folder, vllm_environment

pytestmark = pytest.mark.slow

MAX_MODEL_LEN = 2048
STARTUP_S = 300


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@AT_SESSION_START.register("server")
def start_server(request: pytest.FixtureRequest) -> Started:
    """The server on a dense folder saved with a byte-level BPE tokenizer and without a decoding plan (fitted at load,
    which the log says)."""
    tokenizer = request.getfixturevalue("tokenizer")
    workdir = request.getfixturevalue("tmp_path_factory").mktemp("vllm-server")
    folder = save_folder(workdir / "model", "dense", False, vocab_size=len(tokenizer))
    tokenizer.save_pretrained(folder)
    port = _free_port()
    log = workdir / "server.log"
    with open(log, "w") as output:
        process = subprocess.Popen([str(require_vllm()), "-m", "vllm.entrypoints.openai.api_server", "--model",
                                    str(folder), "--host", "127.0.0.1", "--port", str(port), "--dtype", "float32",
                                    "--enforce-eager", "--max-model-len", str(MAX_MODEL_LEN), "--trust-remote-code"],
                                   cwd=workdir, env=vllm_environment(), stdout=output, stderr=subprocess.STDOUT)
    return Started(process, log, {"base": f"http://127.0.0.1:{port}", "model": str(folder)})


@pytest.fixture(scope="module")
def server(started_at_session_start, request: pytest.FixtureRequest):
    """The server once it answers /health (started at the session's first test); stopped with SIGTERM by the last
    test."""
    started = AT_SESSION_START.take("server", started_at_session_start, request)
    process, base = started.process, started.inputs["base"]
    deadline = time.monotonic() + STARTUP_S
    while True:
        try:
            if httpx.get(f"{base}/health", timeout=5).status_code == 200:
                break
        except httpx.TransportError:
            pass
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            pytest.fail(f"the server did not answer /health within {STARTUP_S} s:\n" + started.log.read_text()[-4000:])
        time.sleep(2)
    yield {"base": base, "model": started.inputs["model"], "process": process, "log": started.log}
    if process.poll() is None:
        process.kill()
        process.wait()


def _request(server, prompt: str, max_tokens: int, **extra) -> dict:
    # Every requested token, each in the text (a random model's tokens include the tokenizer's special ones).
    return {"model": server["model"], "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True,
            "skip_special_tokens": False, **extra}


def _complete(server, body: dict) -> str:
    """The completion's text, streamed or not."""
    if not body.get("stream"):
        response = httpx.post(f"{server['base']}/v1/completions", json=body, timeout=120)
        assert response.status_code == 200, response.text
        assert response.json()["usage"]["completion_tokens"] == body["max_tokens"]  # every token was generated
        return response.json()["choices"][0]["text"]
    text = []
    with httpx.stream("POST", f"{server['base']}/v1/completions", json=body, timeout=120) as response:
        assert response.status_code == 200
        for line in response.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                text.append(json.loads(line[6:])["choices"][0]["text"])
    return "".join(text)


def _bodies(server) -> list[dict]:
    words = "the assert statement checks a condition and a function definition binds a name ".split()
    return [_request(server, " ".join(words[: 1 + (7 * i) % len(words)] * (1 + i % 4)), 8 + 3 * (i % 5),
                     stream=i % 2 == 1) for i in range(16)]


def test_a_folder_without_a_plan_fits_it_at_load_saying_so(server):
    log = server["log"].read_text()
    assert "has no decoding_plan.safetensors: fitting the decoding plan of 2 layers at load" in log


def test_concurrent_requests_complete_as_each_alone(server):
    bodies = _bodies(server)
    alone = [_complete(server, body) for body in bodies]
    with ThreadPoolExecutor(max_workers=16) as pool:
        together = list(pool.map(lambda body: _complete(server, body), bodies))
    assert together == alone
    assert any(alone)  # (a token may be part of a character the detokenizer holds back, so some texts are empty)


def test_invalid_requests_get_400_and_the_server_keeps_serving(server):
    too_long = _request(server, "word " * (2 * MAX_MODEL_LEN), 4)
    bad_sampling = _request(server, "a function", 4, temperature=-1.0)
    for body in (too_long, bad_sampling):
        response = httpx.post(f"{server['base']}/v1/completions", json=body, timeout=60)
        assert response.status_code == 400, response.text
    first = _bodies(server)[0]
    assert _complete(server, first) == _complete(server, first)


def test_a_dropped_stream_leaves_the_server_serving(server):
    body = _request(server, "the assert statement", 1500, stream=True)
    with httpx.stream("POST", f"{server['base']}/v1/completions", json=body, timeout=60) as response:
        assert response.status_code == 200
        next(response.iter_lines())  # read the first event, then drop the connection
    first = _bodies(server)[0]
    expected = _complete(server, first)
    assert httpx.get(f"{server['base']}/health", timeout=10).status_code == 200
    assert _complete(server, first) == expected


def test_sigterm_stops_the_server(server):
    process = server["process"]
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=60) is not None
