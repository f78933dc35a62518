"""FFT sizes: smooth (2^a 3^b 5^c) lengths that stay fast whatever the sequence length they must cover."""

from __future__ import annotations


def smooth_size(minimum: int) -> int:
    """Smallest 2^a 3^b 5^c >= ``minimum``: FFT sizes that stay fast whatever the length they must cover."""
    best = 1 << max(minimum - 1, 0).bit_length()
    p3 = 1
    while p3 < best:
        p35 = p3
        while p35 < best:
            size = p35
            while size < minimum:
                size *= 2
            best = min(best, size)
            p35 *= 5
        p3 *= 3
    return best


def fft_length(n: int) -> int:
    """Smallest 2^a 3^b 5^c >= 2n: a linear (not circular) convolution of n samples with a kernel of lags
    -(n-1)..n-1 needs at least 2n - 1 points, and smooth sizes keep the FFT fast for any n."""
    return smooth_size(2 * n)
