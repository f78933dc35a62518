"""The contract every token mixer implements: what its kernel is (not how to convolve with it), and the memoisation
its kernel quantities need."""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from .fit_store import PlanStore
from .ops_dispatch import ConvolutionKernel, convolve, shared_kernel
from .runtime import as_dtype, compute_dtype, tracing

if TYPE_CHECKING:
    from .ops_documents import DocumentLayout
    from .ops_input_map import InputMap

# Parameter-free tensors (TokenMixer.constant) a mixer keeps: one or two per input length it has seen.
MAX_CONSTANTS = 16


class TokenMixer(nn.Module):
    """Mixes a sequence along its length, per channel: ``y[:, i, c] = sum_j T_c[i, j] x[:, j, c]``.

    A Toeplitz mixer declares its kernel and nothing about how to convolve with it (ops_dispatch.convolve decides):
    :meth:`taps` (real taps around lag 0), :meth:`spectrum` where it has a cheaper one than the FFT of its taps,
    :attr:`fixed_support` for a kernel of fixed short support, :meth:`native_spectrum` where its spectrum is its own
    parametrisation, :attr:`rebuilds_taps` where backward may recompute the taps instead of keeping them. A mixer
    whose operator is not such a convolution (SKI) overrides :meth:`mix`. Inputs arrive with padding positions
    already zeroed; ``attention_mask`` (b, n) is passed for mixers whose operator depends on each row's real length.

    In eval mode, kernel quantities that depend only on the weights and the length are memoised with
    :meth:`cached`, until a parameter changes (an optimizer step, ``load_state_dict``) or ``train()`` is called.
    """

    # The largest lag of a kernel of fixed support (FD), None for a kernel as long as the input.
    fixed_support: int | None = None
    # Backward may call :meth:`taps` again instead of keeping them, when it recomputes spectra: for kernels as long
    # as the input whose taps cost little next to the FFTs (the dense RPE).
    rebuilds_taps: bool = False

    def __init__(self, channels: int, causal: bool, recompute_spectra: bool | None = None):
        super().__init__()
        self.channels = channels
        self.causal = causal
        self._eval_cache: dict[Hashable, Any] = {}
        self._eval_cache_version: tuple = ()
        self._constants: dict[Hashable, torch.Tensor] = {}
        # What the FFT convolution keeps for backward: None decides by size, True saves only the real inputs and
        # recomputes their spectra, False keeps the spectra (TnnConfig.fft_recompute).
        self.recompute_spectra = recompute_spectra
        # The compact decoding plans fitted for (or shipped with) these weights (fit_plans.modal_tail).
        self.decoding_plans = PlanStore()

    def forward(self, x: torch.Tensor, attention_mask: torch.Tensor | None = None,
                input_map: InputMap | None = None, documents: DocumentLayout | None = None) -> torch.Tensor:
        """Mix ``x`` (b, n, channels), or ``input_map(x)`` when given (the map then runs inside the operator, which
        keeps only ``x`` for backward where it can; see ops_fused_gating). With ``documents`` (a packed batch) each
        document is mixed alone by this mixer's own operator (ops_documents)."""
        dtype = compute_dtype(x.dtype)
        with torch.autocast(device_type=x.device.type, enabled=False):
            inputs = as_dtype(x, dtype)
            if documents is None:
                y = self.mix(inputs, attention_mask, input_map)
            else:
                y = self.mix_documents(inputs if input_map is None else input_map(inputs), documents)
        return as_dtype(y, x.dtype)

    def mix_documents(self, x: torch.Tensor, documents: DocumentLayout) -> torch.Tensor:
        """Each document of a packed batch mixed alone by this mixer's operator, bucket by bucket (ops_documents);
        each bucket brings the mask of its documents' real tokens. A convolution evaluates its kernel once, at the
        longest document's reach, for every bucket (ops_dispatch.shared_kernel)."""
        if type(self).mix is not TokenMixer.mix:  # an operator of its own (SKI)
            return documents.mix(x, self.mix)
        reach = max(documents.lengths) - 1
        if self.fixed_support is not None:
            reach = min(reach, self.fixed_support)
        kernel = shared_kernel(self.convolution_kernel(x.device, x.dtype), reach)
        return documents.mix(x, lambda block, mask: convolve(block, kernel, self.recompute_spectra))

    def mix(self, x: torch.Tensor, attention_mask: torch.Tensor | None, input_map: InputMap | None = None
            ) -> torch.Tensor:
        """Mix ``x`` in the compute dtype: the convolution with the declared kernel."""
        return convolve(x, self.convolution_kernel(x.device, x.dtype), self.recompute_spectra, input_map)

    # -- the kernel -----------------------------------------------------------------------------------------------

    def taps(self, reach: int, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
        """The kernel at lags ``0..reach`` (causal) or ``-reach..reach`` (bidirectional), (rows, channels), in
        ``dtype``."""
        raise NotImplementedError(f"{type(self).__name__} does not declare its kernel's taps.")

    def spectrum(self, reach: int, fft_len: int, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
        """rfft (fft_len // 2 + 1, channels) of :meth:`taps` laid out circularly on ``fft_len`` points (lag m at slot
        m mod fft_len). Mixers override it where they build the layout more cheaply."""
        taps = self.taps(reach, device, dtype)
        layout = torch.cat([taps, taps.new_zeros(fft_len - taps.shape[0], taps.shape[1])])
        return torch.fft.rfft(layout.roll(0 if self.causal else -reach, 0), dim=0)

    def native_spectrum(self, reach: int, fft_len: int) -> bool:
        """Whether :meth:`spectrum` at this reach and grid is the kernel's own parametrisation (no FFT of taps), to
        be used even when gradients flow."""
        return False

    def convolution_kernel(self, device: torch.device, dtype: torch.dtype) -> ConvolutionKernel:
        """This mixer's kernel as ops_dispatch.convolve takes it, with taps and spectra memoised in eval mode."""
        memoising = self._memoising()  # asked once per call (it checks for tracing)
        remember = self._remember if memoising else lambda key, compute: compute()
        return ConvolutionKernel(
            taps=lambda reach: remember(("taps", reach, device, dtype), lambda: self.taps(reach, device, dtype)),
            spectrum=lambda reach, fft_len: remember(("spectrum", reach, fft_len, device, dtype),
                                                     lambda: self.spectrum(reach, fft_len, device, dtype)),
            causal=self.causal, support=self.fixed_support, spectrum_cached=memoising,
            native_spectrum=self.native_spectrum,
            rebuild=(lambda reach: self._rebuilder(reach, device, dtype)) if self.rebuilds_taps else None)

    def _rebuilder(self, reach: int, device: torch.device, dtype: torch.dtype) -> Callable[[], torch.Tensor] | None:
        """What the convolution's backward calls for the taps instead of keeping them: the taps again, refused if a
        parameter changed in place since the forward (the values would no longer be the same). None when tracing."""
        if tracing():
            return None
        version = self.parameter_version()

        def rebuild() -> torch.Tensor:
            if self.parameter_version() != version:
                raise RuntimeError(f"{type(self).__name__}: a parameter changed in place between forward and backward; "
                                   "the kernel the backward rebuilds would differ from the forward's.")
            return self.taps(reach, device, dtype)
        return rebuild

    # -- recurrent decoding (causal mixers; see decoding_state.py and decoding_plan.py) ----------------------------

    def causal_taps(self, n: int, device: torch.device) -> torch.Tensor:
        """The causal kernel ``t_0 .. t_{n-1}`` (n, channels) the parallel path applies."""
        raise NotImplementedError(f"{type(self).__name__} has no causal recurrent form.")

    def ssm_kernel(self, length: int, device: torch.device) -> tuple[torch.Tensor, float]:
        """``(taps, gamma)`` with ``t_k = taps[k] * gamma**k`` for k < length: what ETSC converts into an SSM
        (the decay is folded into the SSM's eigenvalues, which is exact)."""
        raise NotImplementedError(f"{type(self).__name__} has no causal recurrent form.")

    def ssm_kernel_decay(self) -> float:
        """The ``gamma`` :meth:`ssm_kernel` folds into the eigenvalues (1: the kernel does not decay)."""
        return 1.0

    def kernel_support(self, device: torch.device) -> int | None:
        """Number of causal taps that reach an output to float32 resolution (lags beyond contribute nothing a
        float32 model can see), or None when the kernel has no such bound. Decoding keeps that many past inputs."""
        return None

    def has_kernel_support(self) -> bool:
        """Whether this kind of kernel has a :meth:`kernel_support`, known before any weight is read (a cache asks it
        when built): its decoding states then keep their shapes from the prefill on (a window of the support, or
        the compact state), so a compiled decode step is one graph."""
        return False

    def modal_tail_rpe(self) -> nn.Module | None:
        """Where the mixer offers the compact decoding state (an exact window and its tail as modes): the RPE
        (:class:`~modeling_tnn.rpe.Rpe`) whose values times ``ssm_kernel_decay()**k`` (below 1) are the causal taps.
        The modal fit evaluates the kernel from it in float64 and bounds its tail by its ``supremum_bound``. None:
        no compact state."""
        return None

    # -- eval-mode memoisation -----------------------------------------------------------------------------------
    def train(self, mode: bool = True) -> "TokenMixer":
        self._eval_cache.clear()
        return super().train(mode)

    def parameter_version(self) -> tuple:
        """The parameters' versions, storages, devices and dtypes: changes whenever a value may have (an optimizer
        step, `load_state_dict`, `.to()`), which invalidates what was computed from them."""
        return tuple((p._version, p.data_ptr(), p.device, p.dtype) for p in self.parameters())

    def _memoising(self) -> bool:
        # Under torch.compile / torch.export parameters are fake tensors (no storage to key on): trace the maths.
        return not (self.training or torch.is_grad_enabled() or tracing())

    def constant(self, key: Hashable, compute: Callable[[], Any]) -> Any:
        """``compute()`` for tensors that depend on no parameter (lags, decay factors, frequency grids), memoised
        under ``key`` in training as in eval: building it costs a few operators per call that every step repeats.
        Recomputed under torch.compile / export (a traced tensor must not outlive its trace); at most
        ``MAX_CONSTANTS`` are kept."""
        if tracing():
            return compute()
        if key not in self._constants:
            if len(self._constants) >= MAX_CONSTANTS:
                self._constants.clear()
            with torch.no_grad():
                self._constants[key] = compute()
        return self._constants[key]

    def cached(self, key: Hashable, compute: Callable[[], Any]) -> Any:
        """``compute()``, memoised under ``key`` in eval mode without autograd; recomputed otherwise."""
        if not self._memoising():
            return compute()
        return self._remember(key, compute)

    def _remember(self, key: Hashable, compute: Callable[[], Any]) -> Any:
        """:meth:`cached` once it is known to memoise: the entry under ``key``, dropped with every entry when a
        parameter has changed since."""
        version = self.parameter_version()
        if version != self._eval_cache_version:
            self._eval_cache.clear()
            self._eval_cache_version = version
        if key not in self._eval_cache:
            self._eval_cache[key] = compute()
        return self._eval_cache[key]
