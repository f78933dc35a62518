"""The scale ladder's sizes: :class:`Rung` and the rungs :mod:`.scale_ladder` measures, apart from both halves of
the ladder (:mod:`.scale_ladder` and :mod:`.scale_ladder_training` each import this module, not each other)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Rung:
    """One size of the ladder: a TNN preset with overrides, the tokens of one training step, and rows dropped on
    purpose (``{row key: reason}``; keys ``"train <n>"``, ``"prefill"``, ``"decode <model> <batch> <context>"``)."""

    name: str
    preset: str
    overrides: dict = field(default_factory=dict)
    tokens: int = 4096
    drops: dict = field(default_factory=dict)


# Tokens per training step: the training benchmark's 8,192 at 6M (batch 16 at n = 512, 4 at 2,048), 2,048 at 48.7M
# and 125M (batch 4 and 1), one sequence at 350M (a step of 2,048 tokens there takes about a minute on one thread).
RUNGS = {rung.name: rung for rung in (
    Rung("6M", "small", dict(hidden_size=256, num_hidden_layers=4), tokens=8192),
    Rung("48.7M", "wikitext103_lm", tokens=2048),
    Rung("125M", "wikitext103_lm", dict(hidden_size=768, num_hidden_layers=12), tokens=2048),
    Rung("350M", "wikitext103_lm", dict(hidden_size=1024, num_hidden_layers=24), tokens=512),
)}
QUICK_RUNGS = {rung.name: rung for rung in (
    Rung("tiny-32", "tiny", dict(vocab_size=256), tokens=2048),
    Rung("tiny-64", "tiny", dict(hidden_size=64, num_hidden_layers=3, vocab_size=256), tokens=2048,
         drops={"train 2048": "an example of a row dropped on purpose (--quick)"}),
)}
