"""The ETSC decoding state (Qin & Zhong, EMNLP 2023): the kernel as a diagonal SSM, (b, c, M) complex.

``h = lambda * h + b * v_t``, ``o_t = Re(sum_s h_s)``. With the decay folded into the eigenvalues
(``lambda_s = gamma exp(-2 pi i s / m)``, ``b = IDFT(t_0 .. t_{m-1})``) the plain DFT basis is stable, and when m
covers the kernel's support the SSM is exact at every length. A kernel that does not decay keeps ETSC's closing tap
``t_L = -sum(t)`` (so that the undamped mode ``lambda_0 = 1`` vanishes) and is exact for contexts of at most
``etsc_length`` tokens only; beyond, its kernel repeats with period ``L + 1``, and decoding warns once. A real kernel
has a conjugate-symmetric spectrum: only the modes ``s = 0 .. m // 2`` are kept (their weights folded into ``b``),
which halves the state.

Until the context fills the SSM's period the state is a window of the inputs (cheaper, and exact); the token that
fills it converts the window into the SSM state once, in parallel. So the state is the SSM exactly when at least
``period`` tokens have been seen.
"""

from __future__ import annotations

import dataclasses
import math
from typing import TYPE_CHECKING

import torch

from .decoding_poles import pole_powers
from .decoding_state import DecodingState, Positions, States, one_position
from .decoding_window import reversed_taps, window_history, window_prefill, window_step
from .runtime import compute_dtype

if TYPE_CHECKING:
    from .mixer_base import TokenMixer


def etsc_modes(taps: torch.Tensor, gamma: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """ETSC with its closing tap: ``(lambda (L,), b (L, c))``, complex128, with
    ``sum_s b_s lambda_s**k == taps[k] * gamma**k`` for ``k < L`` and ``-sum(taps) gamma**L`` at ``k = L``.
    ``taps`` is (L, c); the computation runs in float64/complex128 whatever its dtype."""
    lam, b = dft_modes(closed(taps), gamma)
    return lam[1:], b[1:]  # the taps sum to zero, so b_0 = 0


def dft_modes(taps: torch.Tensor, gamma: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """The plain DFT basis of period ``m = len(taps)``: ``lambda_s = gamma exp(-2 pi i s / m)``, ``b = IDFT(taps)``,
    so that ``sum_s b_s lambda_s**k == taps[k mod m] * gamma**k`` for every k. complex128, shapes (m,), (m, c)."""
    m = taps.shape[0]
    b = torch.fft.ifft(taps.to(torch.float64), dim=0)               # b_s = 1/m sum_k t_k exp(+2 pi i s k / m)
    s = torch.arange(m, dtype=torch.float64, device=taps.device)
    return gamma * torch.exp(-2j * math.pi * s / m), b


def half_spectrum(lam: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Modes ``0 .. m // 2`` of a full DFT basis of a real kernel, with the weight of their conjugate partner folded
    into ``b`` (2, except 1 for ``s = 0`` and ``s = m / 2``): ``Re(sum_s b_s lambda_s**k)`` is the same kernel."""
    m = lam.shape[0]
    keep = m // 2 + 1
    weights = torch.full((keep,), 2.0, dtype=torch.float64, device=b.device)
    weights[0] = 1.0
    if m % 2 == 0:
        weights[-1] = 1.0
    return lam[:keep], b[:keep] * weights[:, None]


def ssm_kernel(lam: torch.Tensor, b: torch.Tensor, n: int) -> torch.Tensor:
    """The impulse response ``Re(sum_s b_s lambda_s**k)`` for k < n, (n, c): what the SSM applies."""
    return (pole_powers(lam, torch.arange(n, device=lam.device)) @ b).real


def closed(taps: torch.Tensor) -> torch.Tensor:
    """The taps (float64) followed by ETSC's closing tap ``-sum(taps)``."""
    t = taps.to(torch.float64)
    return torch.cat([t, -t.sum(dim=0, keepdim=True)])


def ssm_constants(mixer: TokenMixer, period: int, is_closed: bool, device: torch.device,
                  dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """(lambda (M,), b (c, M)), complex of the real compute ``dtype``, for an SSM of ``period``, memoised by the
    mixer's eval cache (a plain dict: parameters stay real, so ``model.to(torch.bfloat16)`` cannot drop an imaginary
    part)."""
    def convert():
        taps, gamma = mixer.ssm_kernel(period - 1 if is_closed else period, device)
        taps = taps.detach()
        lam, b = half_spectrum(*dft_modes(closed(taps) if is_closed else taps, gamma))
        return lam.to(dtype.to_complex()), b.t().to(dtype.to_complex()).contiguous()
    return mixer.cached(("ssm", period, is_closed, device, dtype), convert)


def ssm_state(v: torch.Tensor, lam: torch.Tensor, coef: torch.Tensor, period: int) -> torch.Tensor:
    """The SSM state (b, c, M) after inputs ``v`` (b, T, c) from an empty state, in parallel:
    ``h_s = b_s sum_k lambda_s**k v_{T-1-k}``, i.e. ``b_s`` times the DFT (period m) of the decayed, reversed inputs;
    lags ``k >= m`` fold onto ``k mod m``, exactly as the recurrence wraps them."""
    b, steps, c = v.shape
    real = coef.real.dtype
    decay = lam[0].abs().to(real)
    reversed_inputs = v.flip(1).to(real).transpose(1, 2)                                   # (b, c, T)
    reversed_inputs = reversed_inputs * decay ** torch.arange(steps, device=v.device, dtype=real)
    folds = -(-steps // period)
    if folds * period != steps:
        reversed_inputs = torch.nn.functional.pad(reversed_inputs, (0, folds * period - steps))
    folded = reversed_inputs.reshape(b, c, folds, period).sum(2)
    return coef[None] * torch.fft.rfft(folded, dim=-1)                                     # modes s = 0 .. m // 2


def ssm_contribution(state: torch.Tensor, lam: torch.Tensor, steps: int) -> torch.Tensor:
    """What the state contributes to the next ``steps`` outputs: ``Re(sum_s lambda_s**(i+1) h_s)``, (b, steps, c)."""
    powers = pole_powers(lam, torch.arange(1, steps + 1, device=lam.device))               # (steps, M)
    return torch.einsum("is,bcs->bic", powers, state).real


@dataclasses.dataclass(eq=False)
class SsmState(DecodingState):
    """ETSC's SSM of ``period`` (``is_closed``: with the closing tap, exact up to ``horizon`` tokens), one state
    tensor: a window of the inputs (b, period, c) until ``period`` tokens are seen, then the complex SSM state
    (b, c, M). Every row steps at one position (the state changes kind at a position)."""

    PLAN = "ssm"
    CONSTANTS = ("lam", "coef", "taps_twice")

    period: int = 0
    is_closed: bool = False
    horizon: int | None = None
    lam: torch.Tensor | None = None         # (M,) complex: the eigenvalues
    coef: torch.Tensor | None = None        # (c, M) complex: their weights
    taps_twice: torch.Tensor | None = None  # (2 period, c): the window phase's reversed taps

    @property
    def fixed_shapes(self) -> bool:
        return False  # a window until the period fills, then a complex state

    def describe(self) -> dict:
        return {**super().describe(), "window": self.period}

    def prefill(self, mixer: TokenMixer | None, v: torch.Tensor, positions: Positions = 0) -> States:
        """From the inputs ``v`` of every token seen so far (``positions`` of them held nowhere: zero inputs)."""
        seen = one_position(positions, self.PLAN) + v.shape[1]
        if seen >= self.period:
            return (ssm_state(v, self.lam, self.coef, self.period),)
        if self.taps_twice is None:
            self.taps_twice = reversed_taps(mixer, self.period, v.device, compute_dtype(v.dtype))
        return (window_prefill(v, positions, self.period),)

    def step(self, states: States, v_t: torch.Tensor, positions: Positions,
             host_count: int | None = None) -> tuple[torch.Tensor, States]:
        seen = one_position(positions, self.PLAN)
        state = states[0]
        if seen >= self.period:
            state.mul_(self.lam).addcmul_(self.coef, v_t.to(state.dtype)[..., None])
            return state.real.sum(-1), states
        out = window_step(state, self.taps_twice, v_t, seen)
        if seen + 1 == self.period:  # the window is full: it becomes the SSM state
            return out, self.prefill(None, window_history(state, seen + 1))
        return out, states

    def chunk(self, mixer: TokenMixer, states: States, v: torch.Tensor,
              positions: Positions) -> tuple[torch.Tensor, States]:
        seen = one_position(positions, self.PLAN)
        n = v.shape[1]
        state = states[0]
        if seen < self.period:  # the window phase: the held inputs and the chunk through the exact kernel
            history = torch.cat([window_history(state, seen).to(v.dtype), v], dim=1)
            return mixer(history, None)[:, -n:], self.prefill(mixer, history)
        out = mixer(v, None) + ssm_contribution(state, self.lam, n).to(v.dtype)
        decayed = state * pole_powers(self.lam, n)
        return out, (decayed + ssm_state(v, self.lam, self.coef, self.period),)
