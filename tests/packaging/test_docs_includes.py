"""The docs quote results/, never copy it: every `<!-- include: PATH -->` block of README.md, CHANGELOG.md and
docs/*.md holds exactly the text of PATH (run_scripts/render_docs.py fills them; `make bench` runs it), and the
script refuses the markers and paths it cannot honour instead of keeping an old copy."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

from tests.support import PROJECT_ROOT

SCRIPT = PROJECT_ROOT / "run_scripts" / "render_docs.py"
RENDERER = PROJECT_ROOT / "modeling_tnn" / "recipes" / "docs" / "includes.py"


def render(root: Path, *flags: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), "--root", str(root), *flags], capture_output=True, text=True,
                          timeout=60)


def page_with(block: str) -> str:
    return f"# Page\n\nSome prose.\n\n{block}\n\nMore prose.\n"


def test_every_included_block_equals_its_source():
    result = render(PROJECT_ROOT, "--check")
    assert result.returncode == 0, result.stdout + result.stderr + "\nrun: python run_scripts/render_docs.py"


def test_the_docs_include_results():
    result = render(PROJECT_ROOT, "--check")
    count = int(result.stdout.strip().splitlines()[-1].split()[0])
    assert count > 0, result.stdout


def test_render_fills_a_block_and_check_then_passes(tmp_path):
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "table.md").write_text("| a | b |\n|---|---|\n| 1 | 2 |\n")
    (tmp_path / "README.md").write_text(page_with("<!-- include: results/table.md -->\n<!-- end include -->"))
    assert render(tmp_path, "--check").returncode == 1
    assert render(tmp_path).returncode == 0
    text = (tmp_path / "README.md").read_text()
    assert "<!-- include: results/table.md -->\n\n| a | b |\n|---|---|\n| 1 | 2 |\n\n<!-- end include -->" in text
    assert text.startswith("# Page\n\nSome prose.") and text.endswith("More prose.\n")
    assert render(tmp_path, "--check").returncode == 0
    assert render(tmp_path).stdout.strip().endswith("0 updated")  # rendering twice changes nothing


def test_check_names_a_block_that_drifted_from_its_source(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "table.md").write_text("| ratio |\n|---|\n| 1.30x |\n")
    page = tmp_path / "docs" / "speed.md"
    page.write_text(page_with("<!-- include: results/table.md -->\n\n| ratio |\n|---|\n| 1.25x |\n\n"
                              "<!-- end include -->"))
    result = render(tmp_path, "--check")
    assert result.returncode == 1
    assert "docs/speed.md:5 differs from results/table.md" in result.stdout
    assert "1.25x" in page.read_text()  # --check writes nothing


def test_a_missing_source_is_an_error(tmp_path):
    (tmp_path / "README.md").write_text(page_with("<!-- include: results/gone.md -->\nold\n<!-- end include -->"))
    result = render(tmp_path, "--check")
    assert result.returncode == 2 and "results/gone.md does not exist" in result.stderr


def test_an_unclosed_or_stray_marker_is_an_error(tmp_path):
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "t.md").write_text("x\n")
    (tmp_path / "README.md").write_text(page_with("<!-- include: results/t.md -->\nx"))
    assert "has no '<!-- end include -->'" in render(tmp_path).stderr
    (tmp_path / "README.md").write_text(page_with("x\n<!-- end include -->"))
    assert "without an opening include marker" in render(tmp_path).stderr


def test_a_path_outside_the_repository_is_an_error(tmp_path):
    root = tmp_path / "repo"
    root.mkdir()
    (tmp_path / "secret.md").write_text("x\n")
    (root / "README.md").write_text(page_with("<!-- include: ../secret.md -->\n<!-- end include -->"))
    result = render(root)
    assert result.returncode == 2 and "outside the repository" in result.stderr


def test_included_headings_move_under_the_page(tmp_path):
    """A generated table.md starts with its benchmark's `# title`: on the page it becomes a level-4 heading, and a
    `#` inside a code fence stays as it is."""
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "table.md").write_text("# decoding\n\n## batch 1\n\n```bash\n# a comment\n```\n")
    (tmp_path / "README.md").write_text(page_with("<!-- include: results/table.md -->\n<!-- end include -->"))
    assert render(tmp_path).returncode == 0
    text = (tmp_path / "README.md").read_text()
    assert "\n#### decoding\n\n##### batch 1\n\n```bash\n# a comment\n```\n" in text
    assert render(tmp_path, "--check").returncode == 0


def test_the_renderer_needs_only_the_standard_library():
    """render_docs.py loads the renderer from its file, before anything is installed: neither imports a module
    outside the standard library (``modeling_tnn`` included, whose import needs torch)."""
    for path in (SCRIPT, RENDERER):
        imported = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                imported |= {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom):
                assert node.level == 0, f"{path.name} imports relatively: {ast.unparse(node)}"
                imported.add(node.module.split(".")[0])
        assert imported and imported <= set(sys.stdlib_module_names) | {"__future__"}, (path.name, imported)
