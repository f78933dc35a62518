"""transformers' own model tests (ModelTesterMixin, GenerationTesterMixin, PipelineTesterMixin, ConfigTester) over
every TNN class, run as an in-tree model's test file runs: 0 failed.

``TRANSFORMERS_TESTS_DIR`` names a transformers test tree (its root holds ``tests/test_modeling_common.py``; CI sets
it to ``../shared/hf-tests``). The tree is copied to a temporary folder, our test module
(``transformers_mixins/test_modeling_tnn.py``, every adaptation explained there) is laid in as
``tests/models/tnn/test_modeling_tnn.py``, and pytest runs it in a subprocess with this project on ``PYTHONPATH``.
``RUN_SLOW=1`` also runs the mixins' slow tests (as transformers' nightly CI does). Without the variable the test is
skipped, saying so.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import transformers

from tests.support import PROJECT_ROOT

TESTS_DIR_VARIABLE = "TRANSFORMERS_TESTS_DIR"
OUR_MODULE = Path(__file__).resolve().parent / "transformers_mixins" / "test_modeling_tnn.py"
# Passed tests before this file existed (issue 32's run over the same classes and mixers): no fewer now.
MINIMUM_PASSED = {"fast": 285, "slow": 291}


def _run_slow() -> bool:
    return os.environ.get("RUN_SLOW", "").lower() in ("1", "yes", "true", "y", "on")


def _writable_copy(source: Path, target: Path) -> None:
    """Copy the tree (CI's copy of it has no write bits) and make the copy writable: the tests write beside it."""
    shutil.copytree(source, target, ignore=shutil.ignore_patterns(".git", "__pycache__"), symlinks=True)
    for folder, _, files in os.walk(target):
        for name in [folder, *(os.path.join(folder, file) for file in files)]:
            if not os.path.islink(name):
                os.chmod(name, os.stat(name).st_mode | stat.S_IWUSR)


def lay_out_tree(source: Path, target: Path) -> Path:
    """A writable copy of the transformers test tree ``source`` at ``target``, with our module as an in-tree
    model's test file, ready for pytest to run from ``target``."""
    _writable_copy(source, target)
    model_tests = target / "tests" / "models" / "tnn"
    model_tests.mkdir(parents=True, exist_ok=True)
    (model_tests / "__init__.py").touch()
    shutil.copyfile(OUR_MODULE, model_tests / "test_modeling_tnn.py")
    # The tree's pipeline mixin reads transformers' sources from <root>/src/transformers, where a checkout of
    # transformers keeps them: point that at the installed package under test.
    library = target / "src" / "transformers"
    if not library.exists():
        library.parent.mkdir(exist_ok=True)
        library.symlink_to(Path(transformers.__file__).resolve().parent, target_is_directory=True)
    return model_tests


def summary_counts(output: str) -> dict[str, int]:
    """The counts of pytest's closing line (``3 failed, 285 passed, 12 skipped, 40 subtests passed in 9s``);
    subtest counts under ``subtests <outcome>``."""
    closing = [line for line in output.splitlines() if re.search(r"\d+ (passed|failed|errors?|skipped)", line)]
    if not closing:
        return {}
    counts = {}
    for number, subtests, outcome in re.findall(r"(\d+) (subtests )?(passed|failed|errors?|skipped|xfailed|xpassed)",
                                                closing[-1]):
        key = ("subtests " if subtests else "") + ("error" if outcome.startswith("error") else outcome)
        counts[key] = int(number)
    return counts


@pytest.fixture(scope="module")
def transformers_tests_dir() -> Path:
    value = os.environ.get(TESTS_DIR_VARIABLE)
    if not value:
        pytest.skip(f"{TESTS_DIR_VARIABLE} is not set: point it at a transformers test tree (a folder holding "
                    "tests/test_modeling_common.py, e.g. ../shared/hf-tests) to run transformers' own model tests")
    folder = Path(value).expanduser().resolve()
    assert (folder / "tests" / "test_modeling_common.py").is_file(), (
        f"{TESTS_DIR_VARIABLE}={value} holds no transformers test tree (no tests/test_modeling_common.py)")
    return folder


def test_summary_counts_reads_pytest_s_closing_line():
    counts = summary_counts("x\n= 2 failed, 285 passed, 572 skipped, 6495 subtests passed, 1 error in 9.1s =\n")
    assert counts == {"failed": 2, "passed": 285, "skipped": 572, "subtests passed": 6495, "error": 1}


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_transformers_model_tests_pass_over_every_tnn_class(transformers_tests_dir, tmp_path):
    for module in ("parameterized", "xdist", "httpx"):  # what the tree imports (the dev extra installs them)
        assert importlib.util.find_spec(module), f"{module} is missing: pip install -e \".[dev]\""
    root = tmp_path / "transformers_tests"
    model_tests = lay_out_tree(transformers_tests_dir, root)
    env = {**os.environ, "HF_HUB_OFFLINE": "1",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(PROJECT_ROOT), os.environ.get("PYTHONPATH")]))}
    workers = str(max(1, min(4, os.cpu_count() or 1)))
    command = [sys.executable, "-m", "pytest", str(model_tests.relative_to(root)), "-p", "no:cacheprovider",
               "-n", workers, "-q", "-W", "ignore", "-rfE", "--timeout", "900", "-o", "console_output_style=classic"]
    result = subprocess.run(command, cwd=root, env=env, capture_output=True, text=True)
    output = result.stdout + result.stderr
    counts = summary_counts(output)
    mismatch = re.search(r"ImportError: cannot import name '(\w+)' from '(transformers[\w.]*)'", output)
    if mismatch and not counts.get("passed") and not counts.get("failed"):  # the module could not even be imported
        # The tree is another release's (CI's shared tree is 5.24's; `make test` installs the newest the pin admits):
        # its mixins import helpers this transformers does not have. `make test-mixins` runs them on the tree's own.
        pytest.skip(f"the test tree at {transformers_tests_dir} is not transformers {transformers.__version__}'s: it "
                    f"imports {mismatch.group(1)} from {mismatch.group(2)}, which this version lacks; run it with its "
                    "own transformers (make test-mixins)")
    print(f"transformers {transformers.__version__} mixins over TNN: {counts}")  # shown with -rP / -s
    failures = [line for line in output.splitlines() if line.startswith(("FAILED", "ERROR"))]
    assert counts, output[-5000:]
    assert counts.get("failed", 0) == 0 and counts.get("error", 0) == 0 and counts.get("subtests failed", 0) == 0, \
        "\n".join(failures) or output[-5000:]
    minimum = MINIMUM_PASSED["slow" if _run_slow() else "fast"]
    assert counts.get("passed", 0) >= minimum, (counts, output[-3000:])
    assert result.returncode == 0, output[-5000:]
