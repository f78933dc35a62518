"""Fill the docs' included blocks from the generated files under results/, so that every measured number lives in
one place and the pages quote it.

A page includes a file between two markers, the path relative to the repository root:

    <!-- include: results/bench_generation/table.md -->
    (the file's text, written by this script)
    <!-- end include -->

    python run_scripts/render_docs.py            # rewrite every stale block in place (make bench runs it last)
    python run_scripts/render_docs.py --check    # change nothing; exit 1 naming every stale block

The pages are README.md, CHANGELOG.md and docs/*.md. The file's headings move three levels down (``# x`` becomes
``#### x``), so that an included table sits under the page's own sections. A block whose file is missing, a marker
without its end, or a path outside the repository is an error (exit 2): a page never silently keeps an old copy.
Standard library only, and no import of this package: ``render_docs.py`` loads this file by its path, so that it runs
before anything is installed.
"""

from __future__ import annotations

import argparse
import re
import sys
from dataclasses import dataclass
from pathlib import Path

DEFAULT_ROOT = Path(__file__).resolve().parents[3]  # the checkout holding modeling_tnn/
BEGIN = re.compile(r"^<!-- include: (\S+) -->$")
END = "<!-- end include -->"
HEADING = re.compile(r"^(#{1,6})(\s.*)?$")
HEADING_SHIFT = 3  # an included file's top heading becomes a level-4 heading of the page


class IncludeError(ValueError):
    """A page's markers are malformed or name a file that cannot be included."""


@dataclass(frozen=True)
class Block:
    """One included block of a page: the source it names and the lines it spans (the markers excluded)."""

    page: Path
    line: int  # 1-based line of the opening marker
    source: str
    start: int  # index of the first line after the opening marker
    stop: int  # index of the closing marker


def pages(root: Path) -> list[Path]:
    """The markdown pages that may include results: the README, the changelog and docs/*.md."""
    candidates = [root / "README.md", root / "CHANGELOG.md", *sorted((root / "docs").glob("*.md"))]
    return [page for page in candidates if page.is_file()]


def find_blocks(page: Path, lines: list[str]) -> list[Block]:
    """Every include block of ``page``; raises IncludeError on an opening marker without its end or a nested one."""
    blocks, opened = [], None
    for index, line in enumerate(lines):
        match = BEGIN.match(line.strip())
        if match:
            if opened is not None:
                raise IncludeError(f"{page}:{index + 1}: include inside the include opened at line {opened[0] + 1}")
            opened = (index, match.group(1))
        elif line.strip() == END:
            if opened is None:
                raise IncludeError(f"{page}:{index + 1}: '{END}' without an opening include marker")
            blocks.append(Block(page, opened[0] + 1, opened[1], opened[0] + 1, index))
            opened = None
    if opened is not None:
        raise IncludeError(f"{page}:{opened[0] + 1}: include of {opened[1]} has no '{END}'")
    return blocks


def demote_headings(text: str) -> str:
    """``text`` with every markdown heading outside code fences ``HEADING_SHIFT`` levels deeper (at most 6)."""
    lines, fenced = [], False
    for line in text.split("\n"):
        if line.lstrip().startswith("```"):
            fenced = not fenced
        match = None if fenced else HEADING.match(line)
        if match:
            line = "#" * min(6, len(match.group(1)) + HEADING_SHIFT) + (match.group(2) or "")
        lines.append(line)
    return "\n".join(lines)


def source_text(root: Path, block: Block) -> str:
    """The text a block must hold: its file's, headings demoted, without surrounding blank lines."""
    path = (root / block.source).resolve()
    if not path.is_relative_to(root.resolve()):
        raise IncludeError(f"{block.page}:{block.line}: {block.source} is outside the repository")
    if not path.is_file():
        raise IncludeError(f"{block.page}:{block.line}: {block.source} does not exist (run make bench?)")
    return demote_headings(path.read_text().strip("\n"))


def rendered_body(text: str) -> list[str]:
    """A block's lines: a blank line on each side of the file's text, so markdown renders it as its own blocks."""
    return ["", *text.split("\n"), ""]


def block_body(lines: list[str], block: Block) -> str:
    """The text a page holds in a block, without surrounding blank lines (what is compared with the source)."""
    return "\n".join(lines[block.start:block.stop]).strip("\n")


def render_page(root: Path, page: Path) -> tuple[str, list[Block], list[Block]]:
    """The page with every block filled from its source, its blocks, and those of them that were stale."""
    lines = page.read_text().split("\n")
    blocks = find_blocks(page, lines)
    stale = [block for block in blocks if block_body(lines, block) != source_text(root, block)]
    for block in reversed(blocks):  # from the end, so earlier blocks' line indices stay valid
        lines[block.start:block.stop] = rendered_body(source_text(root, block))
    return "\n".join(lines), blocks, stale


def main(argv: list[str] | None = None) -> int:
    """Render (or with ``--check`` compare) every page's blocks; the exit status: 0, 1 for stale blocks under
    ``--check``, 2 for a malformed block."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 if a block differs from its file")
    parser.add_argument("--root", type=Path, default=DEFAULT_ROOT, help="the repository root (default: this one)")
    args = parser.parse_args(argv)
    total, stale_blocks, changed = 0, [], []
    try:
        for page in pages(args.root):
            text, blocks, stale = render_page(args.root, page)
            total += len(blocks)
            stale_blocks += stale
            if stale and not args.check:
                page.write_text(text)
                changed.append(page)
    except IncludeError as error:
        print(f"render_docs: {error}", file=sys.stderr)
        return 2
    if args.check:
        for block in stale_blocks:
            print(f"stale: {block.page.relative_to(args.root)}:{block.line} differs from {block.source}")
        print(f"{total} included blocks, {len(stale_blocks)} stale")
        return 1 if stale_blocks else 0
    for page in changed:
        print(f"rendered {page.relative_to(args.root)}")
    print(f"{total} included blocks, {len(stale_blocks)} updated")
    return 0

