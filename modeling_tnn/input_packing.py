"""The keywords a TNN forward takes beyond its own arguments, and the documents of a packed batch.

Every keyword a forward receives is used or refused (:func:`split_keywords`):

- the packing keywords of ``transformers.DataCollatorWithFlattening`` (:data:`PACKING_KEYWORDS`): ``position_ids``
  restarting at 0 at each document, ``cu_seq_lens_q/k`` and ``max_length_q/k`` (``return_flash_attn_kwargs=True``),
  ``seq_idx`` (``return_seq_idx=True``), alone or together (they must then agree); they make a
  :class:`~modeling_tnn.ops_documents.DocumentLayout` (:func:`document_layout`) and each document is mixed alone;
- the loss keywords of each head's transformers loss function go to it: ``num_items_in_batch`` (Trainer's) for
  every head with a loss, ``ignore_index`` for the token and sequence losses, ``shift_labels`` for the causal LM
  (:data:`LOSS_KEYWORDS`, :data:`CAUSAL_LM_LOSS_KEYWORDS`);
- what transformers passes every model is accepted where it holds for TNN: ``output_attentions`` and
  ``output_router_logits`` false (TNN has neither), ``is_causal`` equal to the model's direction, and, for heads
  without a decoding cache or per-position selection, ``use_cache`` false and ``logits_to_keep`` 0;
- anything else raises ``TypeError`` naming it.

When position_ids mark documents: only without a decoding cache and without padding. Under a padding mask (as
``generate`` builds them under left padding: 0 on padding, then 0, 1, 2, ... on the tokens) or while continuing a
cache, they are positions: each row's real tokens must be numbered consecutively (after padding, also on from the
padding slot before them: generate's numbering of what it appends to a right-padded prompt), and they are never read
as document breaks. TNN's mixers are Toeplitz (relative), so positions carry nothing else. Under torch.compile /
torch.export (no values to read) position_ids are taken as positions in an inference graph (no gradients: what
generate and transformers' exporter trace) and refused in a training graph; a packed batch must run eagerly.
"""

from __future__ import annotations

from typing import Any

import torch

from .ops_documents import DocumentLayout, build_layout
from .runtime import tracing

PACKING_KEYWORDS = ("position_ids", "cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k", "seq_idx")
LOSS_KEYWORDS = ("num_items_in_batch", "ignore_index")
CAUSAL_LM_LOSS_KEYWORDS = LOSS_KEYWORDS + ("shift_labels",)
# Keywords transformers passes models, accepted only with the value that is true of TNN (or of the head).
_FALSE_ONLY = {
    "output_attentions": "TNN has no attention weights",
    "output_router_logits": "TNN has no router",
    "use_cache": "this head keeps no decoding cache",
    "logits_to_keep": "this head scores every position (logits_to_keep must be 0)",
}


def split_keywords(kwargs: dict[str, Any], owner: str, causal: bool, loss: tuple[str, ...] = LOSS_KEYWORDS
                   ) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(packing keywords, loss keywords)`` of a forward's extra ``kwargs``, ``loss`` naming the keywords its loss
    function takes (none for a model without a loss); the others are checked and dropped (``ValueError`` when their
    value does not hold for TNN) or refused (``TypeError``)."""
    packing, loss_kwargs = {}, {}
    accepted = PACKING_KEYWORDS + loss + tuple(_FALSE_ONLY) + ("is_causal",)
    for key, value in kwargs.items():
        if key in PACKING_KEYWORDS:
            if value is not None:  # (None: not given)
                packing[key] = value
        elif key in loss:
            loss_kwargs[key] = value
        elif key in _FALSE_ONLY:
            if value is not None and (isinstance(value, torch.Tensor) or value):  # None, False, 0: off
                raise ValueError(f"{owner}: {key}={value!r} is not supported: {_FALSE_ONLY[key]}.")
        elif key == "is_causal":
            if value is not None and bool(value) != causal:
                raise ValueError(f"{owner}: is_causal={value!r} but this model is {'' if causal else 'not '}causal "
                                 "(config.causal).")
        else:
            raise TypeError(f"{owner}.forward() got an unexpected keyword argument '{key}'; besides its own "
                            f"arguments it accepts {', '.join(accepted)}.")
    return packing, loss_kwargs


def _as_int(value: Any, name: str) -> int:
    if isinstance(value, torch.Tensor):
        if value.numel() != 1:
            raise ValueError(f"{name} must be an int, got a tensor of shape {tuple(value.shape)}.")
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name} must be an int, got {type(value).__name__}.")
    return value


def _per_token(value: Any, name: str, batch: int, width: int) -> torch.Tensor:
    if not isinstance(value, torch.Tensor) or value.dim() != 2 or tuple(value.shape) != (batch, width) \
            or value.dtype.is_floating_point or value.dtype.is_complex or value.dtype == torch.bool:
        shape = tuple(value.shape) if isinstance(value, torch.Tensor) else type(value).__name__
        raise ValueError(f"{name} must be an integer tensor of shape (batch, sequence) = {(batch, width)}, got "
                         f"{shape}.")
    return value


def _check_consecutive(position_ids: torch.Tensor, mask: torch.Tensor | None, why: str) -> None:
    """Each row's real tokens numbered consecutively (any start): positions, not documents. Padding slots are no
    tokens and hold any number; a token right after padding may also count on from that slot's number, as
    ``generate`` numbers the tokens it appends to a right-padded prompt (one past the last slot)."""
    real = torch.ones_like(position_ids, dtype=torch.bool) if mask is None else mask > 0
    positions = position_ids.long()
    index = torch.arange(positions.shape[1], device=positions.device).expand_as(positions)
    # the row's previous real token (-1: none), from the last real one at or before each place
    last_real = torch.where(real, index, torch.full_like(index, -1)).cummax(1).values
    previous_real = torch.cat([torch.full_like(last_real[:, :1], -1), last_real[:, :-1]], 1)
    follows_real = positions == positions.gather(1, previous_real.clamp(min=0)) + 1
    follows_padding = torch.zeros_like(real)
    follows_padding[:, 1:] = ~real[:, :-1] & (positions[:, 1:] == positions[:, :-1] + 1)
    if bool((real & (previous_real >= 0) & ~follows_real & ~follows_padding).any()):
        raise ValueError(f"position_ids: {why} they must number each row's tokens consecutively (one document per "
                         "row; after padding, on from the previous token or from the padding slot before it); "
                         "documents are read from position_ids restarting at 0 only without a cache and without "
                         "padding.")


def _starts_from_positions(position_ids: torch.Tensor) -> torch.Tensor:
    ok_first = bool((position_ids[:, 0] == 0).all())
    previous, current = position_ids[:, :-1], position_ids[:, 1:]
    if not ok_first or not bool(((current == previous + 1) | (current == 0)).all()):
        raise ValueError("position_ids must hold, per row, restarts 0, 1, 2, ... (each document numbered from 0, as "
                         "DataCollatorWithFlattening writes them), or consecutive positions of a padded or cached "
                         f"batch; got rows such as {position_ids[0, :16].tolist()}.")
    return position_ids == 0


def _starts_from_seq_idx(seq_idx: torch.Tensor) -> torch.Tensor:
    if not bool((seq_idx[:, 1:] >= seq_idx[:, :-1]).all()):
        raise ValueError("seq_idx must be non-decreasing along each row (each document's tokens contiguous, as "
                         "DataCollatorWithFlattening(return_seq_idx=True) writes them).")
    starts = torch.ones_like(seq_idx, dtype=torch.bool)
    starts[:, 1:] = seq_idx[:, 1:] != seq_idx[:, :-1]
    return starts


def _starts_from_cu_seq_lens(packing: dict[str, Any], batch: int, width: int) -> torch.Tensor:
    q, k = packing.get("cu_seq_lens_q"), packing.get("cu_seq_lens_k")
    cu = q if q is not None else k
    name = "cu_seq_lens_q" if q is not None else "cu_seq_lens_k"
    if not isinstance(cu, torch.Tensor) or cu.dim() != 1 or cu.dtype.is_floating_point or cu.numel() < 2:
        raise ValueError(f"{name} must be a 1-D integer tensor of cumulative document lengths starting at 0.")
    if q is not None and k is not None and not torch.equal(q.cpu(), k.cpu()):
        raise ValueError("cu_seq_lens_q and cu_seq_lens_k must be equal (a TNN mixes each document with itself).")
    cu = cu.cpu().long()
    if cu[0] != 0 or cu[-1] != batch * width or not bool((cu[1:] > cu[:-1]).all()):
        raise ValueError(f"{name} must rise strictly from 0 to the number of tokens, {batch * width}; got "
                         f"{cu.tolist()[:16]}.")
    if not set(range(0, batch * width, width)) <= set(cu.tolist()):
        raise ValueError(f"{name}: a document crosses the end of a row (every multiple of the row length {width} "
                         "must be a boundary).")
    longest = int((cu[1:] - cu[:-1]).max())
    for key in ("max_length_q", "max_length_k"):
        if packing.get(key) is not None and _as_int(packing[key], key) != longest:
            raise ValueError(f"{key}={packing[key]} disagrees with {name}, whose longest document has {longest} "
                             "tokens.")
    starts = torch.zeros(batch * width, dtype=torch.bool)
    starts[cu[:-1]] = True
    return starts.view(batch, width)


def document_layout(packing: dict[str, Any], *, batch: int, width: int, attention_mask: torch.Tensor | None,
                    continues_cache: bool, device: torch.device) -> DocumentLayout | None:
    """The documents the packing keywords mark (None: one per row, nothing to separate), after checking them
    (``ValueError`` naming the keyword and what is accepted). See the module docstring for when position_ids mark
    documents."""
    given = {key: value for key, value in packing.items() if value is not None}
    if not given:
        return None
    position_ids = given.get("position_ids")
    if position_ids is not None:
        position_ids = _per_token(position_ids, "position_ids", batch, width)
    if tracing():  # no host-side layout in a traced graph: only positions of an inference graph (generate's)
        if set(given) != {"position_ids"} or torch.is_grad_enabled():
            raise ValueError(f"{', '.join(sorted(given))}: packed batches are not read under torch.compile / "
                             "torch.export (their documents are laid out on the host): run a packed forward "
                             "eagerly. A traced graph takes position_ids only without gradients, as positions (what "
                             "generate and transformers' exporter pass).")
        return None
    if continues_cache and width == 1 and set(given) == {"position_ids"}:
        return None  # a decoding step: one position per row, nothing to check (no operator, no synchronisation)
    mask = None if attention_mask is None else attention_mask[:, -width:]
    padded = mask is not None and bool((mask == 0).any())
    if continues_cache or padded:
        others = sorted(set(given) - {"position_ids"})
        if others:
            why = "continuing a decoding cache" if continues_cache else "with padding (attention_mask has zeros)"
            raise ValueError(f"{', '.join(others)}: packed documents are not supported {why}; pass a packed batch "
                             "without attention_mask padding and without a cache.")
        if width > 1:
            why = "continuing a cache," if continues_cache else "under a padding attention_mask,"
            _check_consecutive(position_ids, mask, why)
        return None
    if ("max_length_q" in given or "max_length_k" in given) and not ({"cu_seq_lens_q", "cu_seq_lens_k"} & set(given)):
        raise ValueError("max_length_q/max_length_k come with cu_seq_lens_q/cu_seq_lens_k, which are missing.")
    found = []
    if position_ids is not None:
        found.append(("position_ids", _starts_from_positions(position_ids).cpu()))
    if "seq_idx" in given:
        found.append(("seq_idx", _starts_from_seq_idx(_per_token(given["seq_idx"], "seq_idx", batch, width)).cpu()))
    if {"cu_seq_lens_q", "cu_seq_lens_k"} & set(given):
        found.append(("cu_seq_lens", _starts_from_cu_seq_lens(given, batch, width)))
    name, starts = found[0]
    for other, other_starts in found[1:]:
        if not torch.equal(starts, other_starts):
            raise ValueError(f"{name} and {other} mark different documents; pass consistent packing keywords.")
    if int(starts.sum()) == batch:
        return None  # one document per row: nothing to separate
    lengths = []
    for row in starts:
        begins = row.nonzero().flatten().tolist() + [width]
        lengths.append([end - begin for begin, end in zip(begins[:-1], begins[1:])])
    return build_layout(lengths, width, device)


def backbone_documents(documents: DocumentLayout | None, packing: dict[str, Any], inputs: torch.Tensor,
                       attention_mask: torch.Tensor | None, continues_cache: bool, use_cache: bool | None
                       ) -> tuple[DocumentLayout | None, bool | None]:
    """``(documents, use_cache)`` for a backbone forward on ``inputs`` (ids or embeddings): the ``documents`` a head
    found, else those the packing keywords mark. A packed batch decodes with no cache (``use_cache=True`` with one is
    a ``ValueError``; left unset it becomes False)."""
    if documents is None:
        documents = document_layout(packing, batch=inputs.shape[0], width=inputs.shape[1],
                                    attention_mask=attention_mask, continues_cache=continues_cache,
                                    device=inputs.device)
    elif any(value is not None for value in packing.values()) or continues_cache:
        raise ValueError("documents: pass a DocumentLayout or the packing keywords, not both, and no cache.")
    if documents is not None:
        if use_cache:
            raise ValueError("use_cache=True: a packed batch (documents marked by position_ids, cu_seq_lens or "
                             "seq_idx) returns no decoding cache; pass use_cache=False or one document per row.")
        use_cache = False
    return documents, use_cache
