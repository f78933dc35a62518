"""The protocol every decoding state implements, and the one helper for powers of poles.

A causal token mixer decodes token by token from a state that summarises the inputs it has seen. Each kind of state
is a class (:mod:`~modeling_tnn.decoding_window`, :mod:`~modeling_tnn.decoding_ssm`,
:mod:`~modeling_tnn.decoding_compact`) holding the kernel constants it is read against and the plan's numbers; its
tensors that grow with the batch live, batch first, in the cache layer's ``recurrent_states`` (transformers'
recurrent-layer interface: its beam search, batch repeat and cache tests read and replace them there). Which class a
layer gets is :mod:`~modeling_tnn.decoding_plan`'s choice, from what the mixer declares.

A state is a plain (not frozen) dataclass: its fields are its plan's numbers (plain values) and its kernel constants
(tensors, listed in ``CONSTANTS``), so that the cache flattens into tensors and plain values for torch.export and is
rebuilt from them by calling the class with its fields (:mod:`~modeling_tnn.decoding_cache`).
"""

from __future__ import annotations

import dataclasses
import math
from typing import TYPE_CHECKING, Any, ClassVar

import torch

if TYPE_CHECKING:
    from .decoding_cache import TnnCacheLayer
    from .mixer_base import TokenMixer


def pole_powers(poles: torch.Tensor, exponents: int | torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
    """``poles ** exponents`` for complex ``poles`` of any shape and integer ``exponents`` (an int, or a tensor of
    any shape): shape ``exponents.shape + poles.shape``, in ``dtype`` (default ``poles.dtype``).

    Every power is one ``exp(k log z)`` in complex128, whatever the poles' precision: as accurate as a product of
    float64 factors, at one evaluation per power, and stable for any ``k`` (no repeated multiplication whose rounding
    grows with ``k``). The one place decoding and the modal fit raise poles to powers."""
    log = torch.log(poles.to(torch.complex128))
    if isinstance(exponents, torch.Tensor):
        exponents = exponents.to(device=log.device, dtype=torch.float64).reshape(*exponents.shape, *[1] * log.dim())
    return torch.exp(exponents * log).to(poles.dtype if dtype is None else dtype)


def power_grid(poles: torch.Tensor, start: int, count: int,
               dtype: torch.dtype | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``(coarse, fine)`` with ``z**(start + m B + b) = coarse[m] * fine[b]`` for the ``count`` powers from ``start``
    on: ``fine`` (B, *poles.shape) holds ``z**b`` for ``b < B``, ``coarse`` (M, *poles.shape) ``z**(start + m B)``,
    with ``B ~ sqrt(count)`` and ``M B >= count``. Every factor is one :func:`pole_powers` evaluation, so a range of
    ``count`` powers costs ``B + M`` exps per pole instead of ``count``, each product as exact as a direct power."""
    block = max(1, math.isqrt(count))
    blocks = -(-count // block)
    fine = pole_powers(poles, torch.arange(block, device=poles.device), dtype)
    coarse = pole_powers(poles, start + block * torch.arange(blocks, device=poles.device), dtype)
    return coarse, fine


def pole_power_range(poles: torch.Tensor, start: int, count: int, dtype: torch.dtype | None = None) -> torch.Tensor:
    """``poles ** (start + k)`` for ``k = 0 .. count - 1``, shape ``(count, *poles.shape)`` in ``dtype`` (default
    ``poles.dtype``): the products of :func:`power_grid`'s factors, each factor one exp in complex128 rounded to
    ``dtype`` (a complex64 power is then within a few float32 roundings of the exact one)."""
    coarse, fine = power_grid(poles, start, count, poles.dtype if dtype is None else dtype)
    return (coarse[:, None] * fine[None]).reshape(-1, *poles.shape)[:count]


# Every state class by its plan's name (filled as the classes are defined): how a flattened cache names its layers'
# states, so that a new state needs no change to the cache's pytree code.
STATE_CLASSES: dict[str, type[DecodingState]] = {}


@dataclasses.dataclass(eq=False)
class DecodingState:
    """One layer's decoding state: how the next outputs follow from the inputs seen, and the kernel constants that
    takes. The state tensors themselves live in the cache layer (``layer.recurrent_states``), which every method is
    given; ``seen`` always counts the tokens the layer has seen before the call (padding included).

    Subclasses set ``PLAN`` (the plan's name :meth:`describe` reports), ``CONSTANTS`` (the names of their tensor
    fields) and implement :meth:`prefill`, :meth:`step` and :meth:`chunk`."""

    PLAN: ClassVar[str] = ""
    CONSTANTS: ClassVar[tuple[str, ...]] = ()

    #: The context length up to which the state decodes exactly (None: every length).
    horizon: ClassVar[int | None] = None

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if cls.PLAN:
            STATE_CLASSES[cls.PLAN] = cls

    @property
    def fixed_shapes(self) -> bool:
        """Whether the state's tensors keep their shapes from the prefill on (a compiled step is one graph)."""
        return True

    def prefill(self, layer: TnnCacheLayer, mixer: TokenMixer, v: torch.Tensor, seen: int) -> None:
        """Set the state from mixer inputs ``v`` (b, n, c), the last ``n`` of ``seen`` tokens (the prompt: all of
        them), replacing whatever the layer held."""
        raise NotImplementedError

    def step(self, layer: TnnCacheLayer, mixer: TokenMixer, v_t: torch.Tensor, seen: int,
             counter: torch.Tensor | None) -> torch.Tensor:
        """One token's mixer input ``v_t`` (b, c) after ``seen`` tokens: its output (b, c), the state updated in
        place. ``counter`` holds ``seen`` as a (1,) tensor from the prefill on (a compiled step reads it)."""
        raise NotImplementedError

    def chunk(self, layer: TnnCacheLayer, mixer: TokenMixer, v: torch.Tensor, seen: int) -> torch.Tensor:
        """Several tokens ``v`` (b, n, c) on a filled state: their outputs (b, n, c), and the state after them."""
        raise NotImplementedError

    def reorder(self, layer: TnnCacheLayer, indices: torch.Tensor) -> None:
        """Keep the batch rows ``indices`` (beam search, batch selection): every state tensor is batch first."""
        for i, state in layer.recurrent_states.items():
            if state is not None:
                layer.recurrent_states[i] = state.index_select(0, indices.to(state.device))
                layer.batch_size = layer.recurrent_states[i].shape[0]

    def repeat(self, layer: TnnCacheLayer, repeats: int) -> None:
        """Repeat every batch row ``repeats`` times in place of it (``generate``'s expansion for beams/samples)."""
        for i, state in layer.recurrent_states.items():
            if state is not None:
                layer.recurrent_states[i] = state.repeat_interleave(repeats, dim=0)
                layer.batch_size = layer.recurrent_states[i].shape[0]

    @staticmethod
    def state_bytes(layer: TnnCacheLayer) -> int:
        """Bytes of the layer's decoding state, the whole batch (not the constants, which the weights fix)."""
        return sum(s.numel() * s.element_size() for s in layer.recurrent_states.values() if s is not None)

    def describe(self) -> dict[str, Any]:
        """``plan`` (the plan's name), ``window`` (lags kept exactly, or the SSM's period; None: the whole history),
        ``modes`` (complex modes per channel, None if none) and ``error_bound`` (the certified relative l1 error of
        the layer's kernel, its largest channel's; None where the plan is exact)."""
        return dict(plan=self.PLAN, window=None, modes=None, error_bound=None)

    # -- as plain values and tensors (torch.export's pytree; a plan that is saved later) ----------------------------
    def numbers(self) -> dict[str, Any]:
        """The fields that are plain values (the plan's numbers), by name."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name not in self.CONSTANTS}

    def constants(self) -> list[torch.Tensor | None]:
        """The kernel constants, in ``CONSTANTS`` order."""
        return [getattr(self, name) for name in self.CONSTANTS]

    @classmethod
    def rebuilt(cls, numbers: dict[str, Any], constants: list[torch.Tensor | None]) -> DecodingState:
        """The state of :meth:`numbers` and :meth:`constants`."""
        return cls(**numbers, **dict(zip(cls.CONSTANTS, constants)))
