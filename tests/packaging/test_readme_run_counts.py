"""The README states what holds from one run to the next: a test run's pass counts and times change with every
commit, so they live in pytest's output (CI's log), never in the README's prose."""

from __future__ import annotations

import re

from tests.support import PROJECT_ROOT

# "1,399 passed", "313 in 67 s", "ran 1,400 tests", "1,333 fast ones in 1 min 42 s"
RUN_COUNT = re.compile(r"\b\d[\d,]* (passed|failed|skipped|tests? in|in \d+ (s|min)\b)|\bran [\d,]+ tests\b"
                       r"|\b[\d,]+ \w+ ones in \d")


def test_the_readme_quotes_no_test_run_counts():
    found = [match.group(0) for match in RUN_COUNT.finditer((PROJECT_ROOT / "README.md").read_text())]
    assert not found, found


def test_the_pattern_finds_the_counts_it_is_for():
    old = ("On 2 idle CPU cores `make test` ran 1,400 tests in 5 min 48 s (1,399 passed; ...), `make test-oldest` the "
           "1,333 fast ones in 1 min 42 s ... (299 passed; 313 in 67 s with `RUN_SLOW=1`).")
    assert len(RUN_COUNT.findall(old)) == 5
