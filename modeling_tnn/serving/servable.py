"""Which saved TNN folders vLLM can serve, and why the others are refused.

vLLM generates token by token from a fixed-size state per request: a causal TNN (dense or FD token mixer) whose
every layer decodes from a state of fixed shape. Masked-LM and encoder-head folders are bidirectional (each output
reads later tokens, so there is nothing to generate from left to right), and SKI is bidirectional only.
"""

from __future__ import annotations

from typing import Any

# What `make serve` / LLM(model=...) accepts, by the `architectures` entry of config.json.
SERVED_ARCHITECTURE = "TnnForCausalLM"
# The other TNN classes save folders too; each is refused with the reason below rather than left to vLLM's
# "architecture not supported".
REFUSED_ARCHITECTURES = ("TnnModel", "TnnForMaskedLM", "TnnForSequenceClassification", "TnnForTokenClassification",
                         "TnnForQuestionAnswering")


def refusal(config: Any) -> str | None:
    """Why vLLM cannot serve the TNN folder of ``config`` (its loaded config.json), or None where it can."""
    architectures = list(getattr(config, "architectures", None) or [])
    refused = [name for name in architectures if name in REFUSED_ARCHITECTURES]
    if refused:
        return (f"{refused[0]} is not a causal language model: vLLM serves {SERVED_ARCHITECTURE} folders only (a "
                "masked-LM or encoder head reads tokens on both sides, so it cannot generate left to right)")
    if getattr(config, "token_mixer", None) == "ski":
        return ("token_mixer='ski' is bidirectional only (its inducing grid is neither causal nor a recurrence): "
                "vLLM serves causal TNNs with token_mixer 'dense' or 'fd'")
    if getattr(config, "causal", True) is False:
        return (f"the folder's config has causal=False (a bidirectional model): vLLM serves causal "
                f"{SERVED_ARCHITECTURE} folders only")
    return None


def growing_state(plan: Any, layer: int, mode: str) -> str | None:
    """Why a layer's decoding ``plan`` cannot live in a fixed-size slot (its state grows with the context), or None
    where it can."""
    if plan.fixed_shapes:
        return None
    return (f"layer {layer} decodes with the {plan.PLAN!r} state, which grows with the context "
            f"(generation_cache={mode!r}, or a kernel without a float32 support such as decay_gamma=1): vLLM keeps a "
            "fixed-size state per request, which the compact state or the window of a decaying or FD kernel gives")


def check_servable(config: Any) -> None:
    """Raise ValueError with :func:`refusal`'s reason where ``config``'s folder cannot be served."""
    reason = refusal(config)
    if reason is not None:
        raise ValueError(f"modeling_tnn's vLLM plugin refuses this folder: {reason}.")
