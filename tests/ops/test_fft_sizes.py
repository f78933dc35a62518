"""FFT sizes: smooth lengths long enough for a linear convolution."""

from __future__ import annotations

import pytest

from modeling_tnn.ops_fft_sizes import fft_length


@pytest.mark.parametrize("n", [1, 2, 3, 37, 70, 100, 1000, 4096])
def test_fft_length_is_smooth_and_long_enough(n):
    size = fft_length(n)
    assert size >= 2 * n
    rest = size
    for p in (2, 3, 5):
        while rest % p == 0:
            rest //= p
    assert rest == 1
