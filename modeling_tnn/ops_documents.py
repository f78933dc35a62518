"""Per-document token mixing for packed rows (several documents concatenated along the sequence).

A packed row must be mixed document by document: a Toeplitz operator run over the whole row lets every document see
its neighbours. :class:`DocumentLayout` records where each document lies, once per forward, and :meth:`mix` runs a
mixer's own operator on the documents alone:

- the documents are gathered into length buckets, each a (documents, bucket length) block padded with zeros on the
  right (one ``index_copy`` for all buckets), every bucket is mixed as a batch of short rows, and the outputs are
  gathered back (one ``index_select``). FFT sizes and direct-product sizes follow the documents, not the row;
- a causal or bidirectional Toeplitz product of a document followed by zeros equals the document's own product on
  its positions (the zeros contribute nothing, and no lag longer than the document reaches one of its outputs), so
  the padding of a bucket is exact; SKI, whose inducing grid spans a row's real length, gets each bucket's mask of
  real positions as its padding mask, so each document gets its own grid;
- when every document has the same length and rows hold a whole number of them, the rows are reshaped (a view) into
  one document per row: no copy at all.

Gradients flow through the gather and scatter (their transposes), so every document's gradient is its own.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch


def bucket_length(length: int) -> int:
    """The power of two that holds ``length`` (the smallest): the documents of one bucket are padded to less than
    twice their length (to the bucket's longest document, not to the power), and a batch of mixed lengths runs as a
    few blocks. A finer ladder (adding 3 * 2^k) measured slower: every bucket is one more operator call per mixer
    (SST-2 lengths, one thread: 19 ms against 12 ms a step at the tiny preset, 170 against 165 ms at the small one).
    """
    return 1 << max(0, length - 1).bit_length()


@dataclass(frozen=True)
class DocumentLayout:
    """Where the documents of a (rows, width) packed batch lie, and how :meth:`mix` gathers them into buckets.

    ``lengths``: every document's length, row after row (each row's lengths sum to ``width``). ``slots``: for every
    token (rows * width, row-major), its slot in the concatenation of the buckets' (documents x length) blocks;
    ``buckets``: (documents, length) of each block in that order; ``masks``: each block's (documents, length) mask of
    real positions (None for a block without padding). ``uniform``: the common length when every document has it and
    rows are reshaped instead of gathered (then ``slots`` is None).
    """

    rows: int
    width: int
    lengths: tuple[int, ...]
    slots: torch.Tensor | None
    buckets: tuple[tuple[int, int], ...]
    masks: tuple[torch.Tensor | None, ...]
    uniform: int | None = None

    @property
    def documents(self) -> int:
        """Number of documents in the batch."""
        return len(self.lengths)

    def document_index(self, device: torch.device) -> torch.Tensor:
        """(rows * width,) index of each token's document (row-major), for per-document pooling."""
        sizes = torch.tensor(self.lengths, device=device)
        return torch.repeat_interleave(torch.arange(len(self.lengths), device=device), sizes)

    def mix(self, x: torch.Tensor, mixer: Callable[[torch.Tensor, torch.Tensor | None], torch.Tensor]
            ) -> torch.Tensor:
        """``mixer(block, mask)`` applied to every document alone: ``x`` (rows, width, c) -> (rows, width, c)."""
        b, n, c = x.shape
        if self.uniform is not None:
            return mixer(x.reshape(b * n // self.uniform, self.uniform, c), None).reshape(b, n, c)
        total = sum(docs * length for docs, length in self.buckets)
        flat = x.reshape(b * n, c)
        gathered = flat.new_zeros(total, c).index_copy(0, self.slots, flat)
        outputs, start = [], 0
        for (docs, length), mask in zip(self.buckets, self.masks):
            block = gathered[start:start + docs * length].view(docs, length, c)
            outputs.append(mixer(block, mask).reshape(docs * length, c))
            start += docs * length
        mixed = outputs[0] if len(outputs) == 1 else torch.cat(outputs)
        return mixed.index_select(0, self.slots).view(b, n, c)


def build_layout(lengths_per_row: Sequence[Sequence[int]], width: int, device: torch.device) -> DocumentLayout:
    """The :class:`DocumentLayout` of rows holding documents of ``lengths_per_row`` (each row's sum is ``width``)."""
    lengths = tuple(length for row in lengths_per_row for length in row)
    rows = len(lengths_per_row)
    if len(set(lengths)) == 1 and width % lengths[0] == 0:
        return DocumentLayout(rows, width, lengths, None, ((len(lengths), lengths[0]),), (None,), lengths[0])
    by_bucket: dict[int, list[int]] = {}
    for doc, length in enumerate(lengths):
        by_bucket.setdefault(bucket_length(length), []).append(doc)
    first = [0] * len(lengths)  # each document's first slot in the buckets' concatenation
    buckets, masks, base = [], [], 0
    for key in sorted(by_bucket):
        docs = by_bucket[key]
        block = max(lengths[doc] for doc in docs)  # pad to the longest document of the bucket, not the ladder value
        for k, doc in enumerate(docs):
            first[doc] = base + k * block
        buckets.append((len(docs), block))
        if any(lengths[doc] != block for doc in docs):
            mask = torch.arange(block)[None, :] < torch.tensor([lengths[doc] for doc in docs])[:, None]
            masks.append(mask.to(device=device, dtype=torch.long))
        else:
            masks.append(None)
        base += len(docs) * block
    sizes = torch.tensor(lengths)
    starts = torch.cumsum(sizes, 0) - sizes
    token = torch.arange(rows * width)
    owner = torch.repeat_interleave(torch.arange(len(lengths)), sizes)
    slots = torch.tensor(first)[owner] + token - starts[owner]
    return DocumentLayout(rows, width, lengths, slots.to(device), tuple(buckets), tuple(masks))


def pool_documents(hidden_states: torch.Tensor, layout: DocumentLayout, last: bool) -> torch.Tensor:
    """One row per document of a packed (rows, width, h) batch: its last token (``last``) or the mean of its tokens,
    (documents, h) in the layout's order."""
    flat = hidden_states.reshape(-1, hidden_states.shape[-1])
    sizes = torch.tensor(layout.lengths, device=flat.device)
    if last:
        return flat[torch.cumsum(sizes, 0) - 1]
    sums = flat.new_zeros(layout.documents, flat.shape[1]).index_add(0, layout.document_index(flat.device), flat)
    return sums / sizes[:, None].to(flat.dtype)
