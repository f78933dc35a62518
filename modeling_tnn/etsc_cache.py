"""Recurrent generation for causal TNNs: the ETSC conversion (Qin & Zhong, EMNLP 2023) and the generation cache.

ETSC turns a causal kernel ``t_0 .. t_{L-1}`` into a diagonal SSM exactly: append ``t_L = -sum(t)``; with
``m = L + 1``, ``lambda_s = exp(-2 pi i s / m)`` and ``b = IDFT(t)``, ``t_k = sum_s b_s lambda_s**k`` for every
``k < m``, and ``b_0 = 0`` leaves L modes. A decay ``gamma**k`` folds into the eigenvalues (``lambda_s *= gamma``).
Decoding is then ``h = lambda * h + b * v_t``, ``o_t = Re(sum_s h_s)``: constant time and memory per token.

The SSM equals the parallel (FFT) model for contexts of at most L tokens; beyond, its kernel repeats with period
m (damped by ``gamma**k``). The ``"exact"`` mode keeps the mixer inputs instead: a ring buffer of the kernel's
support for FD (exact at every length in constant memory), the whole history for dense (O(t) per token).
"""

from __future__ import annotations

import math

import torch
from transformers.cache_utils import Cache, LinearAttentionCacheLayerMixin

from .configuration_tnn import GENERATION_CACHE_MODES
from .mixer_base import TokenMixer


def etsc_modes(taps: torch.Tensor, gamma: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """ETSC: ``(lambda (L,), b (L, c))``, complex128, with ``sum_s b_s lambda_s**k == taps[k] * gamma**k`` for
    ``k < L``. ``taps`` is (L, c); the computation runs in float64/complex128 whatever its dtype."""
    length = taps.shape[0]
    t = taps.to(torch.float64)
    extended = torch.cat([t, -t.sum(dim=0, keepdim=True)])             # sums to zero, so b_0 = 0
    b = torch.fft.ifft(extended, dim=0)[1:]                            # b_s = 1/m sum_k t_k exp(+2 pi i s k / m)
    s = torch.arange(1, length + 1, dtype=torch.float64, device=taps.device)
    lam = gamma * torch.exp(-2j * math.pi * s / (length + 1))
    return lam, b


def ssm_kernel(lam: torch.Tensor, b: torch.Tensor, n: int) -> torch.Tensor:
    """The impulse response ``Re(sum_s b_s lambda_s**k)`` for k < n, (n, c): what the SSM applies."""
    k = torch.arange(n, device=lam.device, dtype=lam.real.dtype)
    powers = torch.exp(k[:, None] * torch.log(lam)[None, :])             # (n, L)
    return (powers @ b).real


class TnnCacheLayer(LinearAttentionCacheLayerMixin):
    """One layer's decoding state: the complex SSM state (b, L, c) in ``"etsc"`` mode, the window of past mixer
    inputs (b, W, c) in ``"exact"`` mode."""

    # The dense exact mode grows its window; no static shapes, and transformers 5.23 would build compile-friendly
    # attention masks for a compileable cache.
    is_compileable = False

    def lazy_initialization(self, conv_states=None, recurrent_states=None, state_idx: int = 0) -> None:
        self.device, self.dtype = recurrent_states.device, recurrent_states.dtype
        self.batch_size = recurrent_states.shape[0]
        self.is_recurrent_states_initialized[state_idx] = True

    def update_conv_state(self, conv_states: torch.Tensor, state_idx: int = 0) -> torch.Tensor:
        raise NotImplementedError("TNN layers keep no convolution state.")

    def update_recurrent_state(self, recurrent_states: torch.Tensor, state_idx: int = 0, **kwargs) -> torch.Tensor:
        if not self.is_recurrent_states_initialized[state_idx]:
            self.lazy_initialization(recurrent_states=recurrent_states, state_idx=state_idx)
        self.recurrent_states[state_idx] = recurrent_states
        self.batch_size = recurrent_states.shape[0]
        self.has_previous_state[state_idx] = True  # the stock layer only sets this for conv states
        return recurrent_states

    def reset(self) -> None:
        for i in range(self.number_of_states):
            self.recurrent_states[i] = None
            self.is_recurrent_states_initialized[i] = False
            self.has_previous_state[i] = False

    def batch_repeat_interleave(self, repeats: int) -> None:
        for i, state in self.recurrent_states.items():
            if state is not None:
                self.recurrent_states[i] = state.repeat_interleave(repeats, dim=0)
                self.batch_size = self.recurrent_states[i].shape[0]

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        for i, state in self.recurrent_states.items():
            if state is not None:
                self.recurrent_states[i] = state[indices]
                self.batch_size = self.recurrent_states[i].shape[0]


class TnnCache(Cache):
    """transformers ``Cache`` for TNN generation. ``mode`` is ``"etsc"`` (constant time and memory per token,
    exact up to ``config.etsc_length`` tokens) or ``"exact"`` (exact at every length)."""

    def __init__(self, config, mode: str | None = None):
        mode = mode or config.generation_cache
        if mode not in GENERATION_CACHE_MODES:
            raise ValueError(f"generation_cache must be one of {GENERATION_CACHE_MODES}, got {mode!r}.")
        super().__init__(layers=[TnnCacheLayer() for _ in range(config.num_hidden_layers)])
        self.mode = mode
        self.etsc_length = config.etsc_length
        self._seen_tokens = 0

    def get_seq_length(self, layer_idx: int = 0) -> int:
        # The stock implementation raises for caches made only of linear-attention layers.
        return self._seen_tokens

    def memory_bytes(self) -> int:
        """Bytes held by the decoding states of all layers."""
        return sum(s.numel() * s.element_size() for layer in self.layers for s in layer.recurrent_states.values()
                   if s is not None)


def _etsc_conversion(mixer: TokenMixer, length: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """(lambda, b) as complex64, converted once per set of weights (memoised by the mixer's eval cache, which is
    a plain dict: parameters stay real, so ``model.to(torch.bfloat16)`` cannot drop an imaginary part)."""
    def convert():
        taps, gamma = mixer.ssm_kernel(length, device)
        lam, b = etsc_modes(taps.detach(), gamma)
        return lam.to(torch.complex64), b.to(torch.complex64)
    return mixer.cached(("etsc", length, device), convert)


def _exact_taps(mixer: TokenMixer, n: int, device: torch.device) -> torch.Tensor:
    """Kernel taps 0..n-1, memoised on a power-of-two grid of lengths so decoding does not re-run the RPE per step."""
    size = 1 << max(n - 1, 1).bit_length()
    return mixer.cached(("taps", size, device), lambda: mixer.causal_taps(size, device).detach())[:n]


def prefill_state(mixer: TokenMixer, v: torch.Tensor, mode: str, etsc_length: int) -> torch.Tensor:
    """The decoding state after the prompt ``v`` (b, T, c; pad positions zero), computed in parallel."""
    if mode == "exact":
        window = mixer.decode_window
        return v if window is None else _left_pad(v, window)[:, -window:]
    lam, b = _etsc_conversion(mixer, etsc_length, v.device)
    m = etsc_length + 1
    steps = v.shape[1]
    # h_s = b_s sum_k lambda_s**k v_{T-1-k} = b_s * DFT_m(gamma**k v_{T-1-k})[s]: the DFT of the decayed, reversed
    # prompt. Lags k >= m fold onto k mod m, exactly as the recurrence would wrap them.
    decay = lam[0].abs().to(torch.float32)
    reversed_prompt = v.flip(1).to(torch.float32)
    reversed_prompt = reversed_prompt * decay ** torch.arange(steps, device=v.device, dtype=torch.float32)[:, None]
    folds = -(-steps // m)
    reversed_prompt = _right_pad(reversed_prompt, folds * m).view(v.shape[0], folds, m, v.shape[2]).sum(1)
    spectrum = torch.fft.fft(reversed_prompt, dim=1)[:, 1:]                  # modes s = 1..L
    return b[None] * spectrum


def decode_step(mixer: TokenMixer, v_t: torch.Tensor, state: torch.Tensor, mode: str,
                etsc_length: int) -> tuple[torch.Tensor, torch.Tensor]:
    """One token: ``(o_t (b, 1, c), new_state)``."""
    if mode == "exact":
        window = torch.cat([state, v_t.to(state.dtype)], dim=1)
        if mixer.decode_window is not None:
            window = window[:, -mixer.decode_window:]
        taps = _exact_taps(mixer, window.shape[1], v_t.device).to(torch.float32)
        out = torch.einsum("bwc,wc->bc", window.to(torch.float32), taps.flip(0))
        return out[:, None].to(v_t.dtype), window
    lam, b = _etsc_conversion(mixer, etsc_length, v_t.device)
    state = lam[None, :, None] * state + b[None] * v_t.to(torch.float32)
    return state.sum(dim=1, keepdim=True).real.to(v_t.dtype), state


def mix_with_cache(mixer: TokenMixer, v: torch.Tensor, attention_mask: torch.Tensor | None, layer: TnnCacheLayer,
                   cache: TnnCache) -> torch.Tensor:
    """The token mixer's output for ``v`` (b, n, c), reading and writing ``layer``'s decoding state."""
    if not layer.has_previous_state[0]:
        # Prefill: the parallel FFT path over the prompt, and the state at its end directly from the prompt.
        out = mixer(v, attention_mask)
        layer.update_recurrent_state(prefill_state(mixer, v, cache.mode, cache.etsc_length))
        return out
    state = layer.recurrent_states[0]
    outputs = []
    for i in range(v.shape[1]):
        o_t, state = decode_step(mixer, v[:, i:i + 1], state, cache.mode, cache.etsc_length)
        outputs.append(o_t)
    layer.update_recurrent_state(state)
    return torch.cat(outputs, dim=1)


def _left_pad(x: torch.Tensor, length: int) -> torch.Tensor:
    missing = length - x.shape[1]
    return x if missing <= 0 else torch.cat([x.new_zeros(x.shape[0], missing, x.shape[2]), x], dim=1)


def _right_pad(x: torch.Tensor, length: int) -> torch.Tensor:
    missing = length - x.shape[1]
    return x if missing <= 0 else torch.cat([x, x.new_zeros(x.shape[0], missing, x.shape[2])], dim=1)
