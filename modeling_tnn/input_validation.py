"""Checks of the inputs of ``TnnModel.forward``: a bad input raises a ``ValueError`` that names the argument, its
shape, dtype or range, and what is expected, instead of a failure deep inside an FFT or an embedding lookup.

The checks run at every decoding step, so they are cheap: shape and dtype checks read metadata only, and the value
checks (token ids within the vocabulary, a 0/1 padding mask) cost one host synchronisation together. The value
checks are skipped while ``torch.compile`` or ``torch.export`` traces the model (a data-dependent branch would break
the graph, and fake tensors have no values).
"""

from __future__ import annotations

import torch

from .runtime import tracing


def _shape(tensor: torch.Tensor) -> tuple[int, ...]:
    return tuple(tensor.shape)


def validate_model_inputs(
    input_ids: torch.Tensor | None,
    attention_mask: torch.Tensor | None,
    inputs_embeds: torch.Tensor | None,
    *,
    vocab_size: int,
    hidden_size: int,
    continues_cache: bool = False,
) -> None:
    """Raise ``ValueError`` when the inputs of a TNN forward cannot be run.

    Args:
        input_ids: ``(batch, sequence)`` integer token ids in ``[0, vocab_size)``, or ``None``.
        attention_mask: ``(batch, sequence)`` padding mask of 0 (padding) and 1 (token), boolean, integer or
            floating, or ``None``. When ``continues_cache`` is true it may also cover the cached past: its last
            ``sequence`` columns are this call's tokens.
        inputs_embeds: ``(batch, sequence, hidden_size)`` floating embeddings, or ``None`` (exactly one of
            ``input_ids`` and ``inputs_embeds`` is given).
        vocab_size: Number of rows of the input embedding.
        hidden_size: Width of the model.
        continues_cache: Whether the call continues a decoding cache (the mask may then be wider than the input).

    Empty inputs are refused rather than answered with empty outputs: a Toeplitz mixer has nothing to mix in a
    sequence of length 0, and an empty batch is almost always an upstream mistake. The checks of values (the ids'
    range, a 0/1 mask) cost one host synchronisation: they run on prompts and chunks, not on a decoding step (one
    token per row continuing a cache), which must not stall an accelerator's queue every token.
    """
    if (input_ids is None) == (inputs_embeds is None):
        given = "both" if input_ids is not None else "neither"
        raise ValueError(f"Pass exactly one of input_ids and inputs_embeds (got {given}).")
    if input_ids is not None:
        name, inputs = "input_ids", input_ids
        if not isinstance(input_ids, torch.Tensor):
            raise ValueError(f"input_ids must be a torch.Tensor of token ids, got {type(input_ids).__name__}.")
        if input_ids.dim() != 2:
            raise ValueError(
                f"input_ids must be 2-D (batch, sequence), got shape {_shape(input_ids)}; for a single sequence pass "
                "input_ids[None] (or tokenize with return_tensors='pt')."
            )
        if input_ids.dtype.is_floating_point or input_ids.dtype.is_complex or input_ids.dtype == torch.bool:
            raise ValueError(f"input_ids must hold integer token ids (torch.long), got dtype {input_ids.dtype}.")
    else:
        name, inputs = "inputs_embeds", inputs_embeds
        if not isinstance(inputs_embeds, torch.Tensor):
            raise ValueError(f"inputs_embeds must be a torch.Tensor, got {type(inputs_embeds).__name__}.")
        if inputs_embeds.dim() != 3 or inputs_embeds.shape[-1] != hidden_size:
            raise ValueError(
                f"inputs_embeds must have shape (batch, sequence, hidden_size={hidden_size}), got shape "
                f"{_shape(inputs_embeds)}."
            )
        if not inputs_embeds.dtype.is_floating_point:
            raise ValueError(f"inputs_embeds must be a floating tensor, got dtype {inputs_embeds.dtype}.")
    batch, length = inputs.shape[:2]
    if batch == 0:
        raise ValueError(f"{name} has an empty batch (shape {_shape(inputs)}): pass at least one sequence.")
    if length == 0:
        raise ValueError(
            f"{name} has no tokens (shape {_shape(inputs)}): pass at least one token per sequence (a generate "
            "prompt too: start it with the BOS token to generate from nothing)."
        )

    if attention_mask is not None:
        if not isinstance(attention_mask, torch.Tensor):
            raise ValueError(f"attention_mask must be a torch.Tensor, got {type(attention_mask).__name__}.")
        expected = f"({batch}, >= {length})" if continues_cache else str((batch, length))
        if (attention_mask.dim() != 2 or attention_mask.shape[0] != batch
                or not (attention_mask.shape[1] >= length if continues_cache else attention_mask.shape[1] == length)):
            raise ValueError(
                f"attention_mask must be a 2-D (batch, sequence) padding mask of shape {expected}, got shape "
                f"{_shape(attention_mask)}."
            )
        if attention_mask.dtype.is_complex:
            raise ValueError(f"attention_mask must be boolean, integer or floating, got dtype {attention_mask.dtype}.")

    if (continues_cache and length == 1) or tracing() or inputs.device.type == "meta":
        # A decoding step (tested first: it needs no tracing() call): no host synchronisation per token (an id out
        # of range fails in the embedding).
        return
    # One host synchronisation for every value check.
    stats = []
    if input_ids is not None:
        stats += [input_ids.min().long(), input_ids.max().long()]  # min, max: supported on every backend
    current_mask = None
    if attention_mask is not None and attention_mask.dtype != torch.bool:
        current_mask = attention_mask[:, -length:]
        stats.append(((current_mask != 0) & (current_mask != 1)).any().long())
    if not stats:
        return
    values = torch.stack([s.to(stats[0].device) for s in stats]).tolist()  # .to: a no-op on one device
    if input_ids is not None:
        low, high = values[0], values[1]
        if low < 0 or high >= vocab_size:
            raise ValueError(
                f"input_ids must lie in [0, vocab_size) = [0, {vocab_size}), got values from {low} to {high}; "
                "ids past the embedding come from a tokenizer larger than the model (resize_token_embeddings) or "
                "from a padding value such as -100 left in the inputs."
            )
    if current_mask is not None and values[-1]:
        bad = current_mask[(current_mask != 0) & (current_mask != 1)][0].item()
        raise ValueError(
            f"attention_mask must hold only 0 (padding) and 1 (token), got the value {bad} (dtype "
            f"{attention_mask.dtype}); pass a 0/1 integer or boolean padding mask."
        )
