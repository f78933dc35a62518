"""The embedded default corpus: CPython's own English reference text (``pydoc_data.topics``, about 465 KB), which
every Python installation ships, so demos and smoke tests run with no Hub and no downloaded data."""

from __future__ import annotations


def embedded_corpus() -> list[str]:
    """The documents of the embedded corpus (one per pydoc topic), in a fixed order."""
    from pydoc_data.topics import topics

    return [topics[name].strip() for name in sorted(topics)]


def embedded_splits(validation_fraction: float = 0.1) -> dict[str, list[str]]:
    """``{"train": [...], "validation": [...]}``: every ``round(1 / validation_fraction)``-th document is held out."""
    if not 0 < validation_fraction < 1:
        raise ValueError(f"validation_fraction must lie in (0, 1), got {validation_fraction}.")
    documents = embedded_corpus()
    every = max(2, round(1 / validation_fraction))
    return {
        "train": [d for i, d in enumerate(documents) if i % every != every - 1],
        "validation": [d for i, d in enumerate(documents) if i % every == every - 1],
    }
