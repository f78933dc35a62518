"""Shared fixtures: the test device, the shared data folder, a tokenizer trained on the fly, a fixed seed and one
thread per test, the mixers' two convolution paths, the long subprocesses started at the session's first test. Plain
helpers live in support.py."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from .support import AT_SESSION_START, Started, data_dir, stop_all


@pytest.fixture(scope="session")
def device() -> torch.device:
    """Where tests/models/test_device.py runs its models: ``$TNN_TEST_DEVICE`` (run_scripts/accelerator_check.py sets
    it), else cpu."""
    return torch.device(os.environ.get("TNN_TEST_DEVICE", "cpu"))


@pytest.fixture
def shared_data() -> Path:
    folder = data_dir()
    if folder is None:
        pytest.skip("shared data folder not found: set TNN_DATA_DIR or lay shared/data beside the project")
    return folder


@pytest.fixture(scope="session")
def tokenizer():
    from modeling_tnn.recipes.pretraining.corpus import embedded_corpus
    from modeling_tnn.recipes.pretraining.tokenizer import train_byte_level_bpe

    return train_byte_level_bpe(embedded_corpus()[:20], vocab_size=300)


@pytest.fixture(scope="session", autouse=True)
def started_at_session_start(request: pytest.FixtureRequest) -> Iterator[dict[str, Started]]:
    """The subprocesses of support.AT_SESSION_START that the selected tests wait for, by fixture name: started before
    the first test, they run on the core the suite's one-thread tests leave free."""
    started = AT_SESSION_START.start_needed(request)
    yield started
    stop_all(started)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


@pytest.fixture(autouse=True)
def _one_thread():
    # The tests' tiny matrices run several times faster on one thread, and many times faster when the 2 cores are
    # shared with other work (two threads then wait on each other at every op).
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(params=["direct", "fft"])
def mixer_path(request) -> str:
    """Runs a test once with the dense and FD mixers' short-sequence path (the Toeplitz matrix, for every length the
    test uses) and once with the FFT path (for every length), through a scoped convolution policy."""
    from modeling_tnn.ops_dispatch import convolution_policy, current_policy

    with convolution_policy(current_policy().forcing_direct(request.param == "direct")):
        yield request.param
