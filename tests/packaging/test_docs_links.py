"""Every relative link of README.md and docs/*.md points at a file of the repository, and every #anchor at a heading
of its target (with GitHub's heading slugs)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.support import PROJECT_ROOT

PAGES = [PROJECT_ROOT / "README.md", *sorted((PROJECT_ROOT / "docs").glob("*.md"))]
# [text](target) and ![alt](target), outside code; the target ends at the first space or closing parenthesis.
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.S | re.M)
INLINE_CODE = re.compile(r"`[^`\n]*`")


def github_slugs(markdown: str) -> set[str]:
    """The anchors GitHub gives the headings of a page: lower case, punctuation dropped, spaces as hyphens, and a
    -1, -2, ... suffix on repeats."""
    slugs: set[str] = set()
    for heading in re.findall(r"^#{1,6} +(.+?) *#*$", FENCE.sub("", markdown), re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.replace("`", "").strip().lower()).replace(" ", "-")
        candidate, repeat = slug, 0
        while candidate in slugs:
            repeat += 1
            candidate = f"{slug}-{repeat}"
        slugs.add(candidate)
    return slugs


def relative_links(page: Path) -> list[str]:
    text = INLINE_CODE.sub("", FENCE.sub("", page.read_text()))
    return [target for target in LINK.findall(text) if not re.match(r"[a-z][a-z0-9+.-]*:", target)]


def test_slugs_follow_github():
    assert github_slugs("## The decoding state: `generation_cache`\n## Ctrl-C and SIGTERM\n## Ctrl-C and SIGTERM") == {
        "the-decoding-state-generation_cache", "ctrl-c-and-sigterm", "ctrl-c-and-sigterm-1"}


def test_the_docs_folder_is_linked_from_the_readme():
    assert set(PAGES) > {PROJECT_ROOT / "README.md", PROJECT_ROOT / "docs" / "README.md"}
    assert any(link.startswith("docs/") for link in relative_links(PROJECT_ROOT / "README.md"))


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(PROJECT_ROOT)) for p in PAGES])
def test_relative_links_resolve(page):
    broken = []
    for target in relative_links(page):
        path, _, anchor = target.partition("#")
        resolved = (page.parent / path).resolve() if path else page
        if not resolved.exists():
            broken.append(f"{target} (no such file)")
        elif anchor and resolved.suffix == ".md" and anchor not in github_slugs(resolved.read_text()):
            broken.append(f"{target} (no heading #{anchor} in {resolved.relative_to(PROJECT_ROOT)})")
    assert not broken, f"{page.relative_to(PROJECT_ROOT)}: " + "; ".join(broken)
