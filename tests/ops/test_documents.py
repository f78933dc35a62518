"""Per-document mixing of packed rows (ops_documents): every document's output and gradients equal the document
mixed alone, for every mixer, direction and bucket layout (float64), and the layout's buckets are what it claims."""

from __future__ import annotations

import pytest
import torch

from modeling_tnn.ops_documents import DocumentLayout, bucket_length, build_layout, pool_documents
from modeling_tnn.ops_dispatch import ConvolutionPolicy, convolution_policy, shared_kernel
from modeling_tnn.tnn_block import build_token_mixer

from tests.support import tiny_config

CASES = [("dense", True), ("dense", False), ("fd", True), ("fd", False), ("ski", False)]
# Rows of documents: mixed lengths (several buckets, padding inside a bucket), and equal lengths (the reshape view).
LAYOUTS = [[[5, 1, 9, 3], [7, 2, 6, 3]], [[4, 4, 4], [4, 4, 4]], [[18]]]


def per_document(mixer, x: torch.Tensor, lengths: list[list[int]]) -> torch.Tensor:
    """Each document of ``x`` mixed alone, concatenated back into rows."""
    rows = []
    for row, sizes in zip(x, lengths):
        docs = row.split(sizes)
        rows.append(torch.cat([mixer(doc[None])[0] for doc in docs]))
    return torch.stack(rows)


@pytest.mark.parametrize("kind,causal", CASES)
@pytest.mark.parametrize("lengths", LAYOUTS)
@pytest.mark.parametrize("direct", [True, False])
def test_packed_rows_mix_as_their_documents_alone(kind, causal, lengths, direct):
    torch.manual_seed(0)
    mixer = build_token_mixer(tiny_config(kind, causal=causal, fd_kernel_length=4, ski_rank=3), 5).double()
    width = sum(lengths[0])
    layout = build_layout(lengths, width, torch.device("cpu"))
    x = torch.randn(len(lengths), width, 5, dtype=torch.float64, requires_grad=True)
    weights = torch.randn(len(lengths), width, 5, dtype=torch.float64)
    with convolution_policy(ConvolutionPolicy().forcing_direct(direct)):
        packed = mixer(x, documents=layout)
        grads = torch.autograd.grad((packed * weights).sum(), [x, *mixer.parameters()])
        alone = per_document(mixer, x, lengths)
        expected = torch.autograd.grad((alone * weights).sum(), [x, *mixer.parameters()])
    torch.testing.assert_close(packed, alone, rtol=1e-10, atol=1e-12)
    for got, want in zip(grads, expected):
        torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-11)
    if len(lengths[0]) > 1:  # the packed row is not what the whole row mixed at once gives
        assert not torch.allclose(packed, mixer(x), atol=1e-6)


def test_buckets_follow_the_documents_not_the_row():
    layout = build_layout([[5, 40, 6, 9], [60]], 60, torch.device("cpu"))
    assert isinstance(layout, DocumentLayout) and layout.documents == 5 and layout.uniform is None
    # 5 and 6 share the bucket of 8, 9 is 16's, 40 and 60 64's, each padded to its longest document only
    assert layout.buckets == ((2, 6), (1, 9), (2, 60))
    assert layout.masks[0].tolist() == [[1, 1, 1, 1, 1, 0], [1] * 6] and layout.masks[1] is None
    assert layout.masks[2].sum(1).tolist() == [40, 60]
    assert len(set(layout.slots.tolist())) == 120 and max(layout.slots.tolist()) < 12 + 9 + 120
    assert [bucket_length(n) for n in (1, 2, 3, 4, 5, 7, 9, 13, 17, 33)] == [1, 2, 4, 4, 8, 8, 16, 16, 32, 64]
    uniform = build_layout([[4, 4], [4, 4]], 8, torch.device("cpu"))
    assert uniform.uniform == 4 and uniform.slots is None


@pytest.mark.parametrize("last", [True, False])
def test_pooling_gives_one_row_per_document(last):
    hidden = torch.randn(2, 6, 3, dtype=torch.float64)
    layout = build_layout([[2, 4], [1, 5]], 6, torch.device("cpu"))
    pooled = pool_documents(hidden, layout, last=last)
    docs = [hidden[0, :2], hidden[0, 2:], hidden[1, :1], hidden[1, 1:]]
    expected = torch.stack([d[-1] if last else d.mean(0) for d in docs])
    torch.testing.assert_close(pooled, expected)


def test_a_long_row_of_short_documents_is_mixed_as_short_rows():
    """64 sentences in one 1,000-token row: the mixer's operator never sees a row longer than the longest sentence
    (no FFT as long as the row)."""
    generator = torch.Generator().manual_seed(0)
    lengths = torch.randint(3, 30, (64,), generator=generator).tolist()
    layout = build_layout([lengths], sum(lengths), torch.device("cpu"))
    seen = []
    x = torch.randn(1, sum(lengths), 4)
    y = layout.mix(x, lambda block, mask: seen.append(tuple(block.shape)) or block * 2)
    torch.testing.assert_close(y, x * 2)
    assert max(n for _, n, _ in seen) == max(lengths) and sum(d for d, _, _ in seen) == 64
    assert sum(d * n for d, n, _ in seen) < 2 * sum(lengths)  # each document padded to less than twice its length


@pytest.mark.parametrize("kind,causal", CASES[:4])
def test_a_shared_kernel_cuts_the_same_taps_and_spectra(kind, causal):
    mixer = build_token_mixer(tiny_config(kind, causal=causal, fd_kernel_length=8), 3).double()
    kernel = mixer.convolution_kernel(torch.device("cpu"), torch.float64)
    reach = 7 if kind == "fd" else 20
    shared = shared_kernel(kernel, reach)
    for r in (0, 3, reach):
        torch.testing.assert_close(shared.taps(r), kernel.taps(r), rtol=1e-12, atol=1e-14)
        torch.testing.assert_close(shared.spectrum(r, 32), kernel.spectrum(r, 32), rtol=1e-10, atol=1e-12)
    assert shared.spectrum(3, 32) is shared.spectrum(3, 32)  # built once per grid and reach
