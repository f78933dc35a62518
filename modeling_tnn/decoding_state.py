"""The protocol every decoding state implements: a layer's plan (its numbers and kernel constants) and the tensor
functions that fill and advance the state tensors it describes.

A causal token mixer decodes token by token from a state that summarises the inputs it has seen. Each kind of state
is a class (:mod:`~modeling_tnn.decoding_window`, :mod:`~modeling_tnn.decoding_ssm`,
:mod:`~modeling_tnn.decoding_compact`) holding the plan's numbers and the kernel constants the state is read against;
its methods take the state tensors (batch first) and return them, so that whoever owns the tensors drives them: the
transformers cache layer (:mod:`~modeling_tnn.decoding_cache`, which keeps them in ``recurrent_states``) or a serving
engine's state slots. Which class a layer gets is :mod:`~modeling_tnn.decoding_plan`'s choice, from what the mixer
declares.

Positions are per row: ``positions`` counts the tokens each row has seen before the call, an ``int`` (every row
alike, as in a padded ``generate`` batch) or a ``(b,)`` int64 tensor (a serving batch, each request at its own
position; a ``(1,)`` tensor stands for every row, which is how a compiled step reads the cache's counter).

A state is a plain (not frozen) dataclass: its fields are its plan's numbers (plain values) and its kernel constants
(tensors, listed in ``CONSTANTS``), so that the cache flattens into tensors and plain values for torch.export and is
rebuilt from them by calling the class with its fields (:mod:`~modeling_tnn.decoding_cache`).
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any, ClassVar, Union

import torch

if TYPE_CHECKING:
    from .mixer_base import TokenMixer

#: Tokens each row has seen before a call: one count for every row, or a (b,) int64 tensor of them.
Positions = Union[int, torch.Tensor]
#: A layer's state tensors, batch first, in the order its class documents.
States = tuple[torch.Tensor, ...]

# Every state class by its plan's name (filled as the classes are defined): how a flattened cache names its layers'
# states, so that a new state needs no change to the cache's pytree code.
STATE_CLASSES: dict[str, type[DecodingState]] = {}


@dataclasses.dataclass(eq=False)
class DecodingState:
    """One layer's decoding plan: how the next outputs follow from the inputs seen, and the kernel constants that
    takes. The state tensors are not held here: :meth:`prefill` makes them, :meth:`step` and :meth:`chunk` take and
    return them (the same tensors, updated in place, where :attr:`fixed_shapes`).

    Subclasses set ``PLAN`` (the plan's name :meth:`describe` reports), ``CONSTANTS`` (the names of their tensor
    fields) and implement :meth:`state_shapes`, :meth:`prefill`, :meth:`step` and :meth:`chunk`."""

    PLAN: ClassVar[str] = ""
    CONSTANTS: ClassVar[tuple[str, ...]] = ()

    #: The context length up to which the state decodes exactly (None: every length).
    horizon: ClassVar[int | None] = None
    #: Whether :meth:`step` also takes a token row ``v_t`` (b, 1, c) and returns its output as one (b, 1, c): the
    #: cache then passes the layer's input as it is (no select and unsqueeze around every step).
    STEPS_TOKEN_ROWS: ClassVar[bool] = False

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if cls.PLAN:
            STATE_CLASSES[cls.PLAN] = cls

    @property
    def fixed_shapes(self) -> bool:
        """Whether the state tensors keep their shapes from the prefill on and are updated in place (a compiled step
        is one graph; a serving engine keeps them in fixed slots)."""
        return True

    def state_shapes(self, channels: int) -> tuple[tuple[int, ...], ...]:
        """The shape of each state tensor for one row (the batch dimension left out), for a state of fixed shapes."""
        raise NotImplementedError(f"{type(self).__name__} has no fixed state shapes.")

    def prefill(self, mixer: TokenMixer, v: torch.Tensor, positions: Positions = 0) -> States:
        """The state tensors after mixer inputs ``v`` (b, n, c) that follow ``positions`` tokens of which nothing is
        held (zero inputs: a prompt starts at 0)."""
        raise NotImplementedError

    def step(self, states: States, v_t: torch.Tensor, positions: Positions,
             host_count: int | None = None) -> tuple[torch.Tensor, States]:
        """One token's mixer input ``v_t`` (b, c) after ``positions`` tokens: its output (b, c) and the states (a
        state that sets :attr:`STEPS_TOKEN_ROWS` takes ``v_t`` (b, 1, c) too, and returns (b, 1, c) for it).
        ``host_count``: where ``positions`` is a tensor that every row shares, the same count as a Python int, when
        the caller holds one (a compiled step: its graph indexes with the tensor and may branch on the count); a
        state whose step takes no branch by position has no use for it."""
        raise NotImplementedError

    def chunk(self, mixer: TokenMixer, states: States, v: torch.Tensor,
              positions: Positions) -> tuple[torch.Tensor, States]:
        """Several tokens ``v`` (b, n, c) on filled states: their outputs (b, n, c), and the states after them."""
        raise NotImplementedError

    def reserve(self, mixer: TokenMixer, states: States, positions: int) -> States:
        """The states with room for one more token after ``positions`` (a history that grows); called before
        :meth:`step` where the shapes are not fixed."""
        return states

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


def one_position(positions: Positions, plan: str) -> int:
    """``positions`` as the one count a state that steps every row alike needs (ValueError for a tensor)."""
    if not isinstance(positions, int):
        raise ValueError(f"positions: the {plan!r} decoding state steps every row at one position (an int); rows "
                         f"at their own positions need a state of fixed shapes ('compact' or a window of the kernel's "
                         f"support), got a tensor.")
    return positions
