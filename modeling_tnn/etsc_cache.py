"""Recurrent generation for causal TNNs: the ETSC conversion (Qin & Zhong, EMNLP 2023) and the generation cache.

Two decoding states, chosen per layer by :func:`decode_plan`:

- a **window** of past mixer inputs (b, W, c), read against the kernel's taps: exact. W is the kernel's support:
  FD's fixed support (``fd_kernel_length + 1`` taps), the lags after which a decaying dense kernel
  ``RPE(k) gamma**k`` falls below float32 resolution (:meth:`~modeling_tnn.tno_dense.DenseTno.kernel_support`), or
  the whole history when the kernel does not decay (``decay_gamma == 1``: O(t) per token).
- the diagonal **SSM** of ETSC (b, c, M) complex: ``h = lambda * h + b * v_t``, ``o_t = Re(sum_s h_s)``. With the
  decay folded into the eigenvalues (``lambda_s = gamma exp(-2 pi i s / m)``, ``b = IDFT(t_0 .. t_{m-1})``) the
  plain DFT basis is stable, and when m covers the kernel's support the SSM is exact at every length. A kernel
  that does not decay keeps ETSC's closing tap ``t_L = -sum(t)`` (so that the undamped mode ``lambda_0 = 1``
  vanishes) and is exact for contexts of at most ``etsc_length`` tokens only; beyond, its kernel repeats with
  period ``L + 1``, and decoding warns once. A real kernel has a conjugate-symmetric spectrum: only the modes
  ``s = 0 .. m // 2`` are kept (their weights folded into ``b``), which halves the state.

- the **compact** state of a decaying dense kernel (:mod:`~modeling_tnn.modal_fit`): a window of its first W lags
  (b, W, c) and its tail as r complex modes per channel, ``g = z * g + c * v_{t-W}`` (the input leaving the window
  enters the modes), with a certified bound of the kernel's relative l1 error. The modes are kept as real planes
  (b, 3, c, r): real part, imaginary part and the step's scratch (real arithmetic vectorises where PyTorch's
  complex kernels on CPU do not); everything is allocated at prefill and updated in place.

Until the context fills the SSM's period the SSM mode decodes from the window of inputs (cheaper, and exact),
then converts it into the SSM state once, in parallel. ``generation_cache="auto"`` takes the window wherever the
kernel has a float32 support (it reads each input once per token, where the SSM of the same span updates twice as
many reals in place) and ETSC where it has none.
"""

from __future__ import annotations

import json
import math
import warnings
from dataclasses import dataclass

import torch
from transformers.cache_utils import Cache, LinearAttentionCacheLayerMixin

from .configuration_tnn import GENERATION_CACHE_MODES
from .mixer_base import TokenMixer, compute_dtype, smooth_size, tracing
from .modal_fit import ModalTail, compact_tail
from .tno_dense import DenseTno


def etsc_modes(taps: torch.Tensor, gamma: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """ETSC with its closing tap: ``(lambda (L,), b (L, c))``, complex128, with
    ``sum_s b_s lambda_s**k == taps[k] * gamma**k`` for ``k < L`` and ``-sum(taps) gamma**L`` at ``k = L``.
    ``taps`` is (L, c); the computation runs in float64/complex128 whatever its dtype."""
    lam, b = dft_modes(_closed(taps), gamma)
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
    k = torch.arange(n, device=lam.device, dtype=lam.real.dtype)
    powers = torch.exp(k[:, None] * torch.log(lam)[None, :])             # (n, modes)
    return (powers @ b).real


def _closed(taps: torch.Tensor) -> torch.Tensor:
    t = taps.to(torch.float64)
    return torch.cat([t, -t.sum(dim=0, keepdim=True)])


@dataclass(frozen=True)
class DecodePlan:
    """How one layer decodes: a ``"window"`` of ``capacity`` past inputs (``None``: the whole history), an
    ``"ssm"`` of period ``period`` (``closed``: with ETSC's closing tap), or ``"compact"``: a window of ``capacity``
    lags and ``modes`` complex modes, whose kernel is within ``error_bound`` (relative l1, the largest channel's) of
    the exact one. ``horizon`` is the context length up to which the plan is exact (``None``: every length)."""

    kind: str
    capacity: int | None = None
    period: int | None = None
    closed: bool = False
    horizon: int | None = None
    modes: int | None = None
    error_bound: float | None = None

    def to_tuple(self) -> tuple:
        """The plan as plain values (a pytree context must serialise)."""
        return (self.kind, self.capacity, self.period, self.closed, self.horizon, self.modes, self.error_bound)


# The last tail fitted eagerly is kept on the mixer (this attribute): under torch.export / torch.compile the parameters
# are fake (nothing to fit), so a traced decode uses that fit, or the exact window when there is none. An attribute of
# the module, not a module-level weak dictionary: dynamo guards on what it reads, and a guard on a weak dictionary's
# keys breaks once another model is garbage-collected.
EAGER_TAILS_ATTRIBUTE = "_eager_modal_tails"


def modal_tail(mixer: DenseTno, tolerance: float, device: torch.device) -> ModalTail | None:
    """The mixer's fitted tail, once per set of weights (memoised like its kernel constants); under tracing the last
    eager fit (None if there was none)."""
    if tracing():
        return getattr(mixer, EAGER_TAILS_ATTRIBUTE, {}).get((tolerance, device))
    tail = mixer.cached(("modal tail", tolerance, device), lambda: compact_tail(mixer, tolerance, device))
    if not hasattr(mixer, EAGER_TAILS_ATTRIBUTE):
        object.__setattr__(mixer, EAGER_TAILS_ATTRIBUTE, {})  # plain attribute: not a submodule, not state
    getattr(mixer, EAGER_TAILS_ATTRIBUTE)[(tolerance, device)] = tail
    return tail


def decode_plan(mixer: TokenMixer, mode: str, etsc_length: int, device: torch.device,
                tolerance: float = 1e-5) -> DecodePlan:
    """The decoding state for ``mixer`` in cache ``mode`` (``"auto"``, ``"compact"``, ``"etsc"`` or ``"exact"``).

    ``"compact"`` applies to causal dense kernels that decay; elsewhere it decodes as ``"auto"``. ``"auto"`` takes it
    where the layer's certified bound is at most ``tolerance``."""
    support = mixer.kernel_support(device)
    decays = mixer.ssm_kernel_decay() < 1
    if mode in ("auto", "compact") and isinstance(mixer, DenseTno) and decays:
        tail = modal_tail(mixer, tolerance, device)
        if tail is not None and (mode == "compact" or tail.max_bound <= tolerance):
            return DecodePlan("compact", capacity=tail.window, modes=tail.modes, error_bound=tail.max_bound)
        mode = "auto"
    if mode in ("auto", "compact"):
        # Exact wherever the kernel has a float32 support: a window of that many inputs (FD; dense with gamma < 1,
        # where it reads 1.4-1.8x faster than the exact SSM of the same span, which updates twice as many reals
        # in place). ETSC where nothing exact runs in constant memory (a kernel that does not decay).
        mode = "exact" if support is not None else "etsc"
    if mode == "exact":
        return DecodePlan("window", capacity=support)
    if support is not None and decays:
        return DecodePlan("ssm", period=smooth_size(max(etsc_length, support)))
    return DecodePlan("ssm", period=etsc_length + 1, closed=True, horizon=etsc_length)


class TnnCacheLayer(LinearAttentionCacheLayerMixin):
    """One layer's decoding state (batch first): ``recurrent_states[0]`` is the window of past mixer inputs
    (b, W, c) or the complex SSM state (b, c, M); a compact plan adds its modes (b, c, r) complex as
    ``recurrent_states[1]``. The kernel constants it is read against live beside it."""

    # Whether the state's shapes stay fixed from the prefill on is the cache's to say (TnnCache.is_compileable).
    is_compileable = False

    def __init__(self):
        super().__init__(number_of_states=2)
        self.plan: DecodePlan | None = None
        self.reversed_taps: torch.Tensor | None = None   # (2W, c): the taps reversed, twice (window reads)
        self.lam: torch.Tensor | None = None             # (M,) or, compact, (c, r) complex64: the eigenvalues
        self.coef: torch.Tensor | None = None            # (c, M) or (c, r) complex64: their weights

    def state_bytes(self) -> int:
        """Bytes of this layer's decoding state, the whole batch."""
        return sum(s.numel() * s.element_size() for s in self.recurrent_states.values() if s is not None)

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
    """transformers ``Cache`` for TNN generation, in ``mode`` ``"auto"``, ``"etsc"`` or ``"exact"`` (see
    :class:`~modeling_tnn.TnnConfig`'s ``generation_cache``). ``get_seq_length()`` counts every token seen,
    padding included."""

    def __init__(self, config, mode: str | None = None):
        mode = mode or config.generation_cache
        if mode not in GENERATION_CACHE_MODES:
            raise ValueError(f"generation_cache must be one of {GENERATION_CACHE_MODES}, got {mode!r}.")
        super().__init__(layers=[TnnCacheLayer() for _ in range(config.num_hidden_layers)])
        self.mode = mode
        self.etsc_length = config.etsc_length
        self.tolerance = getattr(config, "compact_tolerance", 1e-5)
        self._seen = 0
        # The same count as a tensor, (1,) int64, from the prefill on: a compiled step reads its ring slots from it,
        # since a Python int would specialise the graph on its value (see _ring_slot).
        self.seen_counter: torch.Tensor | None = None
        self._warned = False
        decays = config.token_mixer == "fd" or getattr(config, "decay_gamma", 1.0) < 1
        self._fixed_shapes = mode != "etsc" and config.causal is not False and decays

    @property
    def is_compileable(self) -> bool:
        """True where every layer's state keeps its shapes from the prefill on (the compact plan or a window of the
        kernel's support: FD, or a dense kernel that decays, in ``"auto"``, ``"compact"`` or ``"exact"``): a
        ``torch.compile``'d decode step is then one graph without breaks for every token, and ``generate`` takes
        its compiled path (``compile_config``; on CPU with ``compile_config._compile_all_devices = True``). False
        for ETSC's SSM (a window until the period fills, then a complex state) and a history that grows."""
        return self._fixed_shapes

    @property
    def _seen_tokens(self) -> int:
        return self._seen

    @_seen_tokens.setter
    def _seen_tokens(self, value: int) -> None:
        self._seen = value
        if self.seen_counter is not None:
            self.seen_counter.fill_(value)

    def get_seq_length(self, layer_idx: int = 0) -> int:
        # The stock implementation raises for caches made only of linear-attention layers.
        return self._seen_tokens

    def memory_bytes(self) -> int:
        """Bytes held by the decoding states of all layers (not the kernel constants, which the weights fix): every
        tensor of the cache that grows with the batch, the sum of :meth:`describe`'s ``state_bytes``."""
        return sum(layer.state_bytes() for layer in self.layers)

    def describe(self) -> list[dict]:
        """One dict per layer: ``plan`` (``"window"``, ``"ssm"``, ``"compact"``; None before the first forward),
        ``window`` (lags kept exactly), ``modes``, ``state_bytes`` (the whole batch) and ``error_bound`` (the
        certified relative l1 error of the layer's kernel, its largest channel's; None where the plan is exact)."""
        rows = []
        for layer in self.layers:
            plan = layer.plan
            rows.append(dict(plan=None if plan is None else plan.kind,
                             window=None if plan is None else (plan.capacity or plan.period),
                             modes=None if plan is None else plan.modes, state_bytes=layer.state_bytes(),
                             error_bound=None if plan is None else plan.error_bound))
        return rows

    def advance(self, tokens: int) -> None:
        """Count ``tokens`` more seen tokens; warn once when an inexact plan passes its horizon."""
        self._seen += tokens
        if self.seen_counter is not None:
            self.seen_counter.add_(tokens)
        if self._warned:
            return
        horizons = {layer.plan.horizon for layer in self.layers if layer.plan is not None} - {None}
        if horizons and self._seen_tokens > min(horizons):
            self._warned = True
            warnings.warn(
                f"TNN generation passed the ETSC horizon of {min(horizons)} tokens (etsc_length): this kernel does "
                "not decay (decay_gamma=1, or generation_cache='etsc' with token_mixer='fd'), so the SSM's kernel "
                "repeats beyond it and outputs drift from the no-cache forward. For exact decoding pass "
                "generation_cache='exact' (to generate or the config), or raise etsc_length.",
                UserWarning, stacklevel=2,
            )


# -- torch.export / torch.compile: the cache as a pytree of its tensors ----------------------------------------------
# The context holds only plain values (plans as tuples), so that torch.export can serialise it; the tensors are the
# leaves: the seen counter, then each layer's two states and its kernel constants.
_LAYER_TENSORS = ("lam", "coef", "reversed_taps")


def _flatten_cache(cache: TnnCache):
    children = [cache.seen_counter]
    for layer in cache.layers:
        children += [layer.recurrent_states[0], layer.recurrent_states[1],
                     *(getattr(layer, name) for name in _LAYER_TENSORS)]
    context = (cache.mode, cache.etsc_length, cache.tolerance, cache._seen_tokens, cache._warned,
               tuple((None if layer.plan is None else layer.plan.to_tuple(), layer.has_previous_state[0])
                     for layer in cache.layers))
    return children, context


def _unflatten_cache(children, context) -> TnnCache:
    mode, etsc_length, tolerance, seen, warned, layers = context
    cache = TnnCache.__new__(TnnCache)
    Cache.__init__(cache, layers=[TnnCacheLayer() for _ in layers])
    cache.mode, cache.etsc_length, cache.tolerance = mode, etsc_length, tolerance
    cache._seen, cache._warned = seen, warned
    cache.seen_counter, children = children[0], children[1:]
    width = 2 + len(_LAYER_TENSORS)
    for index, (layer, (plan, has_state)) in enumerate(zip(cache.layers, layers)):
        window, modes, *constants = children[index * width: (index + 1) * width]
        layer.plan = None if plan is None else DecodePlan(*plan)
        for name, value in zip(_LAYER_TENSORS, constants):
            setattr(layer, name, value)
        for state_idx, state in enumerate((window, modes)):
            if state is not None:
                layer.update_recurrent_state(state, state_idx)
        layer.has_previous_state[0] = has_state
    return cache


def _dumpable_context(context) -> str:
    mode, etsc_length, tolerance, seen, warned, layers = context
    return json.dumps([mode, etsc_length, tolerance, int(seen), warned, [[plan, has] for plan, has in layers]])


def _loaded_context(dumped: str):
    mode, etsc_length, tolerance, seen, warned, layers = json.loads(dumped)
    return (mode, etsc_length, tolerance, seen, warned,
            tuple((None if plan is None else tuple(plan), has) for plan, has in layers))


torch.utils._pytree.register_pytree_node(
    TnnCache, _flatten_cache, _unflatten_cache,
    serialized_type_name=f"{__name__}.TnnCache",
    flatten_with_keys_fn=lambda cache: (
        [(torch.utils._pytree.SequenceKey(i), child) for i, child in enumerate(_flatten_cache(cache)[0])],
        _flatten_cache(cache)[1],
    ),
    to_dumpable_context=_dumpable_context,
    from_dumpable_context=_loaded_context,
)


# -- kernel constants --------------------------------------------------------------------------------------------
def _ssm_constants(mixer: TokenMixer, plan: DecodePlan, device: torch.device,
                   dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """(lambda (M,), b (c, M)), complex of the real compute ``dtype``, for an SSM plan, memoised by the mixer's eval
    cache (a plain dict: parameters stay real, so ``model.to(torch.bfloat16)`` cannot drop an imaginary part)."""
    def convert():
        length = plan.period - 1 if plan.closed else plan.period
        taps, gamma = mixer.ssm_kernel(length, device)
        taps = taps.detach()
        lam, b = dft_modes(_closed(taps) if plan.closed else taps, gamma)
        lam, b = half_spectrum(lam, b)
        return lam.to(dtype.to_complex()), b.t().to(dtype.to_complex()).contiguous()
    return mixer.cached(("ssm", plan.period, plan.closed, device, dtype), convert)


def _reversed_taps(mixer: TokenMixer, width: int, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """(2 width, c) in ``dtype``: taps ``width-1 .. 0`` twice, so that the taps a ring buffer's slots need at any write
    position are one contiguous slice."""
    def build():
        reversed_taps = mixer.causal_taps(width, device).detach().to(dtype).flip(0)
        return torch.cat([reversed_taps, reversed_taps]).contiguous()
    return mixer.cached(("reversed taps", width, device, dtype), build)


# -- the window of past inputs ------------------------------------------------------------------------------------
READ_CHUNK_ELEMENTS = 1 << 20  # elements of one window read's temporary product (4 MiB of float32)


def _window_capacity(plan: DecodePlan, needed: int) -> int:
    """Slots of a window plan's buffer: its support, or (a growing history) a smooth size of at least twice
    ``needed``, so that the history is copied into a larger buffer only O(log t) times."""
    return plan.capacity if plan.capacity is not None else smooth_size(max(2 * needed, 64))


def _window_state(v: torch.Tensor, seen: int, capacity: int) -> torch.Tensor:
    """A zero buffer (b, capacity, c) holding inputs ``v`` (b, n, c), the last ``n`` of ``seen`` tokens, at their ring
    slots ``position mod capacity`` (only the last ``capacity`` fit)."""
    b, n, c = v.shape
    keep = min(n, capacity)
    buffer = v.new_zeros(b, capacity, c, dtype=compute_dtype(v.dtype))
    slots = torch.arange(seen - keep, seen, device=v.device) % capacity
    buffer[:, slots] = v[:, n - keep:].to(buffer.dtype)
    return buffer


def _window_history(buffer: torch.Tensor, seen: int) -> torch.Tensor:
    """The inputs a window holds, oldest first, (b, min(seen, W), c)."""
    capacity = buffer.shape[1]
    held = min(seen, capacity)
    slots = torch.arange(seen - held, seen, device=buffer.device) % capacity
    return buffer[:, slots]


def _ring_slot(seen: int, capacity: int, counter: torch.Tensor | None) -> int | torch.Tensor:
    """The ring slot ``seen mod capacity`` of the next input: a Python int eagerly; under torch.compile a one-element
    tensor from the cache's ``counter`` (the same count), since indexing by a Python int specialises the graph on
    its value (a recompilation per slot), where indexing by a tensor leaves one graph for every step."""
    if counter is None or not torch.compiler.is_compiling():  # (torch.export too; tracing() costs 6 us a call)
        return seen % capacity
    return torch.remainder(counter, capacity)


def _slot_read(buffer: torch.Tensor, slot: int | torch.Tensor) -> torch.Tensor:
    """``buffer[:, slot]`` (b, c)."""
    return buffer[:, slot] if isinstance(slot, int) else buffer.index_select(1, slot)[:, 0]


def _slot_write(buffer: torch.Tensor, slot: int | torch.Tensor, value: torch.Tensor) -> None:
    """``buffer[:, slot] = value`` in place."""
    if isinstance(slot, int):
        buffer[:, slot] = value
    else:
        buffer.index_copy_(1, slot, value[:, None].to(buffer.dtype))


def _window_read(buffer: torch.Tensor, reversed_taps: torch.Tensor, position: int | torch.Tensor,
                 filled: int) -> torch.Tensor:
    """``sum_j buffer[:, j] * t[(position - j) mod W]`` over the ``filled`` slots in use, (b, c); ``position`` is a
    :func:`_ring_slot`."""
    capacity = buffer.shape[1]
    if isinstance(position, int):
        taps = reversed_taps[capacity - 1 - position: 2 * capacity - 1 - position]
    else:  # every window of the doubled taps as a view (W + 1, c, W): the slot's one gathered, no table stored
        taps = reversed_taps.unfold(0, capacity, 1).index_select(0, capacity - 1 - position)[0].t()
    if filled < capacity:  # no wrap yet: slots 0 .. position, a contiguous block of rows
        buffer, taps = buffer[:, :filled], taps[:filled]
    b, width, c = buffer.shape
    # A reduction over the lag rows, vectorised over the channels (measured 1.5-2x faster than channel-major
    # rows), in row chunks: a fresh temporary of the window's size costs page faults (4-10x slower at batch 8).
    rows = max(1, READ_CHUNK_ELEMENTS // (b * c))
    if rows >= width:
        return (buffer * taps).sum(1)
    out = buffer.new_zeros(b, c)
    for start in range(0, width, rows):
        out += (buffer[:, start:start + rows] * taps[start:start + rows]).sum(1)
    return out


# -- the SSM state --------------------------------------------------------------------------------------------------
def _ssm_state(v: torch.Tensor, lam: torch.Tensor, coef: torch.Tensor, period: int) -> torch.Tensor:
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


def _ssm_contribution(state: torch.Tensor, lam: torch.Tensor, steps: int) -> torch.Tensor:
    """What the state contributes to the next ``steps`` outputs: ``Re(sum_s lambda_s**(i+1) h_s)``, (b, steps, c)."""
    powers = torch.exp(torch.arange(1, steps + 1, device=lam.device, dtype=lam.real.dtype)[:, None]
                       * torch.log(lam)[None, :])                                        # (steps, M)
    return torch.einsum("is,bcs->bic", powers, state).real


# -- the compact state: a short window and the modes of the tail ---------------------------------------------------
# Inputs per block of the parallel modal state: its (block, c, r) powers stay a few MB.
MODAL_BLOCK = 128


def _compact_constants(layer: TnnCacheLayer, mixer: TokenMixer, cache: TnnCache, device: torch.device,
                       dtype: torch.dtype) -> None:
    """Poles and residues as real planes (2, c, r) float32 (real, imaginary), and the window's taps."""
    tail = modal_tail(mixer, cache.tolerance, device)
    layer.lam = torch.stack([tail.poles.real, tail.poles.imag]).to(device).contiguous()
    layer.coef = torch.stack([tail.residues.real, tail.residues.imag]).to(device).contiguous()
    layer.reversed_taps = _reversed_taps(mixer, tail.window, device, dtype)


def _complex(planes: torch.Tensor) -> torch.Tensor:
    return torch.complex(planes[0], planes[1])


def _modal_state(inputs: torch.Tensor, poles: torch.Tensor, residues: torch.Tensor) -> torch.Tensor:
    """``residues * sum_i z**(T-1-i) inputs_i`` (b, c, r) complex64 for ``inputs`` (b, T, c), in one parallel pass:
    per channel one matrix product of the blocks of ``MODAL_BLOCK`` inputs with the powers within a block (real and
    imaginary parts side by side), then the blocks weighted by ``z**(block * later blocks)``; the powers come from
    float64 products."""
    b, steps, c = inputs.shape
    modes = residues.shape[1]
    if steps == 0:
        return residues.new_zeros(b, c, modes)
    block = min(steps, MODAL_BLOCK)
    blocks = -(-steps // block)
    inputs = torch.nn.functional.pad(inputs.to(torch.float32), (0, 0, blocks * block - steps, 0))
    rows = inputs.reshape(b * blocks, block, c).permute(2, 0, 1).contiguous()               # (c, b * blocks, block)
    z = poles.to(torch.complex128)
    powers = torch.cat([torch.ones_like(z)[None], z[None].expand(block - 1, -1, -1)]).cumprod(0)  # z**0 .. z**(B-1)
    local = powers.flip(0).permute(1, 0, 2).to(poles.dtype)                                  # (c, block, r): z**(B-1-i)
    with torch.autocast(device_type=rows.device.type, enabled=False):  # the state stays float32 under autocast
        within = torch.bmm(rows, torch.cat([local.real, local.imag], dim=-1))                # (c, b * blocks, 2r)
    within = torch.complex(within[..., :modes], within[..., modes:]).reshape(c, b, blocks, modes)
    later = torch.arange(blocks - 1, -1, -1, device=z.device) * block
    across = torch.exp(later[:, None, None] * torch.log(z)).to(poles.dtype).permute(1, 0, 2)  # (c, blocks, r)
    return residues * (within * across[:, None]).sum(2).permute(1, 0, 2)


def _modal_contribution(state: torch.Tensor, poles: torch.Tensor, steps: int) -> torch.Tensor:
    """What the modes contribute to the next ``steps`` outputs, ``Re(sum_j z_j**(i+1) g_j)`` (b, steps, c)."""
    log = torch.log(poles.to(torch.complex128))
    powers = torch.exp(torch.arange(1, steps + 1, device=log.device)[:, None, None] * log).to(poles.dtype)
    return torch.einsum("icr,bcr->bic", powers, state).real


def _ring_order(seen: int, capacity: int, device: torch.device) -> torch.Tensor:
    """Slots of a ring of ``capacity`` holding positions ``seen - capacity .. seen - 1``, oldest first."""
    return torch.arange(seen - capacity, seen, device=device) % capacity


def _set_compact(layer: TnnCacheLayer, sequence: torch.Tensor, seen: int, prior: torch.Tensor | None) -> None:
    """The compact state after ``sequence`` (b, n, c), the last inputs of ``seen`` tokens: its last W in the window,
    the ones before in the modes (``prior``, the modes before ``sequence``, decayed over it and added)."""
    capacity = layer.plan.capacity
    n = sequence.shape[1]
    keep = min(n, capacity)
    poles = _complex(layer.lam)
    window = _window_state(sequence[:, n - keep:], seen, capacity)
    modes = _modal_state(sequence[:, : n - keep], poles, _complex(layer.coef))
    if prior is not None:
        modes += prior * torch.exp((n - keep) * torch.log(poles.to(torch.complex128))).to(prior.dtype)
    layer.update_recurrent_state(window, 0)
    layer.update_recurrent_state(torch.stack([modes.real, modes.imag, torch.zeros_like(modes.real)], dim=1), 1)


def _compact_step(layer: TnnCacheLayer, v_t: torch.Tensor, seen: int, counter: torch.Tensor | None) -> torch.Tensor:
    """One token on the compact state, in place: the input leaving the window enters the modes, ``v_t`` takes its
    slot; the output is the window read against the exact taps plus the modes' real part."""
    window, modes = layer.recurrent_states[0], layer.recurrent_states[1]
    capacity = window.shape[1]
    position = _ring_slot(seen, capacity, counter)
    real, imag, scratch = modes.unbind(1)
    (pole_re, pole_im), (res_re, res_im) = layer.lam, layer.coef
    leaving = _slot_read(window, position)[..., None]
    if torch.compiler.is_compiling():  # dynamo takes no non-contiguous out= (the planes of a batch above 1)
        scratch.copy_(imag).mul_(pole_im)
    else:
        torch.mul(imag, pole_im, out=scratch)
    imag.mul_(pole_re).addcmul_(real, pole_im).addcmul_(leaving, res_im)
    real.mul_(pole_re).sub_(scratch).addcmul_(leaving, res_re)
    _slot_write(window, position, v_t)
    return _window_read(window, layer.reversed_taps, position, capacity) + real.sum(-1)


def _compact_chunk(layer: TnnCacheLayer, mixer: TokenMixer, v: torch.Tensor, seen: int) -> torch.Tensor:
    """Several tokens on a filled compact state: the window and the chunk through the exact kernel in parallel,
    plus what the modes contribute; then the state after the chunk."""
    window, planes = layer.recurrent_states[0], layer.recurrent_states[1]
    modes = torch.complex(planes[:, 0], planes[:, 1])
    capacity = window.shape[1]
    sequence = torch.cat([window[:, _ring_order(seen, capacity, v.device)].to(v.dtype), v], dim=1)
    n = v.shape[1]
    out = mixer(sequence, None)[:, -n:] + _modal_contribution(modes, _complex(layer.lam), n).to(v.dtype)
    _set_compact(layer, sequence, seen + n, modes)
    return out


# -- decoding ---------------------------------------------------------------------------------------------------------
def _prepare(layer: TnnCacheLayer, mixer: TokenMixer, cache: TnnCache, v: torch.Tensor) -> DecodePlan:
    if layer.plan is None:
        layer.plan = decode_plan(mixer, cache.mode, cache.etsc_length, v.device, cache.tolerance)
        if layer.plan.kind == "ssm":
            layer.lam, layer.coef = _ssm_constants(mixer, layer.plan, v.device, compute_dtype(v.dtype))
        elif layer.plan.kind == "compact":
            _compact_constants(layer, mixer, cache, v.device, compute_dtype(v.dtype))
    return layer.plan


def _set_window(layer: TnnCacheLayer, mixer: TokenMixer, v_all: torch.Tensor, seen: int) -> None:
    """Hold the inputs ``v_all`` (the last of ``seen`` tokens) in a window, or in the SSM once they fill its period."""
    plan = layer.plan
    if plan.kind == "compact":
        _set_compact(layer, v_all, seen, None)
        return
    if plan.kind == "ssm" and seen >= plan.period:
        layer.update_recurrent_state(_ssm_state(v_all, layer.lam, layer.coef, plan.period))
        return
    capacity = plan.period if plan.kind == "ssm" else _window_capacity(plan, seen + 1)
    if layer.reversed_taps is None or layer.reversed_taps.shape[0] != 2 * capacity:
        layer.reversed_taps = _reversed_taps(mixer, capacity, v_all.device, compute_dtype(v_all.dtype))
    layer.update_recurrent_state(_window_state(v_all, seen, capacity))


def _decode_token(layer: TnnCacheLayer, mixer: TokenMixer, v_t: torch.Tensor, seen: int,
                  counter: torch.Tensor | None = None) -> torch.Tensor:
    """One token ``v_t`` (b, c) after ``seen`` tokens (``counter``: the same count as a tensor, or None): the mixer
    output (b, c); the state is updated in place."""
    if layer.plan.kind == "compact":
        return _compact_step(layer, v_t, seen, counter)
    state = layer.recurrent_states[0]
    if state.is_complex():
        state.mul_(layer.lam).addcmul_(layer.coef, v_t.to(state.dtype)[..., None])
        return state.real.sum(-1)
    capacity = state.shape[1]
    if seen >= capacity and (layer.plan.kind == "ssm" or layer.plan.capacity is None):
        # The window is full: convert it into the SSM state, or grow the unbounded history.
        history = torch.cat([_window_history(state, seen), v_t[:, None].to(state.dtype)], dim=1)
        _set_window(layer, mixer, history, seen + 1)
        state = layer.recurrent_states[0]
        if state.is_complex():
            return state.real.sum(-1)
        return _window_read(state, layer.reversed_taps, seen % state.shape[1], seen + 1)
    position = _ring_slot(seen, capacity, counter)
    _slot_write(state, position, v_t)
    return _window_read(state, layer.reversed_taps, position, seen + 1)


def mix_with_cache(mixer: TokenMixer, v: torch.Tensor, attention_mask: torch.Tensor | None, layer: TnnCacheLayer,
                   cache: TnnCache) -> torch.Tensor:
    """The token mixer's output for ``v`` (b, n, c; pad positions zero), reading and writing ``layer``'s state."""
    seen = cache.get_seq_length()
    n = v.shape[1]
    plan = _prepare(layer, mixer, cache, v)
    if not layer.has_previous_state[0]:
        # Prefill: the parallel FFT path over the prompt, and the state at its end directly from the prompt.
        if cache.seen_counter is None:
            cache.seen_counter = torch.full((1,), seen, dtype=torch.long, device=v.device)
        out = mixer(v, attention_mask)
        _set_window(layer, mixer, v, n)
        return out
    if n == 1:
        return _decode_token(layer, mixer, v[:, 0], seen, cache.seen_counter)[:, None].to(v.dtype)
    # Several new tokens on a filled state: their own part in parallel, plus what the past contributes.
    if plan.kind == "compact":
        return _compact_chunk(layer, mixer, v, seen)
    state = layer.recurrent_states[0]
    if state.is_complex():
        out = mixer(v, None) + _ssm_contribution(state, layer.lam, n).to(v.dtype)
        powers = layer.lam ** n
        layer.update_recurrent_state(state * powers + _ssm_state(v, layer.lam, layer.coef, plan.period))
        return out
    history = torch.cat([_window_history(state, seen).to(v.dtype), v], dim=1)
    out = mixer(history, None)[:, -n:]
    _set_window(layer, mixer, history, seen + n)
    return out
