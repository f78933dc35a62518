#!/usr/bin/env python
"""Fill the docs' included blocks (``<!-- include: results/... -->``) from the generated files under results/, so
that every measured number lives in one place and the pages quote it.

    python run_scripts/render_docs.py            # rewrite every stale block in place (make bench runs it last)
    python run_scripts/render_docs.py --check    # change nothing; exit 1 naming every stale block

The renderer is modeling_tnn/recipes/docs/includes.py (its docstring has the rules). It needs only the standard
library, so this script loads it from its file: importing the package would need torch and the train extra.
"""

import importlib.util
import sys
from pathlib import Path

RENDERER = Path(__file__).resolve().parents[1] / "modeling_tnn" / "recipes" / "docs" / "includes.py"


def main(argv: list[str] | None = None) -> int:
    """The renderer's ``main``, loaded without importing ``modeling_tnn``."""
    spec = importlib.util.spec_from_file_location("modeling_tnn_docs_includes", RENDERER)
    renderer = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = renderer  # its dataclass looks its module up there
    spec.loader.exec_module(renderer)
    return renderer.main(argv)


if __name__ == "__main__":
    sys.exit(main())
