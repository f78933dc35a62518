"""TEMPORARY: today's decoding states (``layer.recurrent_states``, one position for the whole batch) behind the
tensor-in/tensor-out plan API that the serving model calls (issue 37): ``state_shapes(channels)``,
``prefill(mixer, v, positions)``, ``step(states, v_t, positions)``, ``chunk(mixer, states, v, positions)``, rows
at their own positions. The maths is the states' own; this file only adapts calls, and goes once the plans offer
that API themselves (then :func:`choose_plan` is ``PLANNERS[mode].choose``)."""

from __future__ import annotations

import torch

from ..decoding_compact import CompactState
from ..decoding_plan import PLANNERS, PlanSettings
from ..decoding_state import DecodingState
from ..decoding_window import WindowState
from ..mixer_base import TokenMixer


class _Rows:
    """What a state reads and writes in a cache layer: its tensors by index."""

    def __init__(self, states: tuple[torch.Tensor, ...] = ()):
        self.recurrent_states = dict(enumerate(states))

    def update_recurrent_state(self, tensor: torch.Tensor, state_idx: int = 0) -> torch.Tensor:
        self.recurrent_states[state_idx] = tensor
        return tensor


def _as_list(positions: int | torch.Tensor, rows: int) -> list[int]:
    if isinstance(positions, int):
        return [positions] * rows
    return [int(p) for p in positions.tolist()]


class BridgedPlan:
    """A layer's :class:`DecodingState` with the per-row, tensor-in/tensor-out calls."""

    def __init__(self, state: DecodingState, mixer: TokenMixer):
        self.state, self.mixer = state, mixer

    def state_shapes(self, channels: int) -> tuple[tuple[int, ...], ...]:
        if isinstance(self.state, CompactState):
            return ((self.state.capacity, channels), (3, channels, self.state.modes))
        if isinstance(self.state, WindowState) and self.state.capacity is not None:
            return ((self.state.capacity, channels),)
        raise ValueError(f"the {self.state.PLAN!r} state grows with the context: not servable in fixed slots")

    def prefill(self, mixer: TokenMixer, v: torch.Tensor, positions: int | torch.Tensor) -> tuple[torch.Tensor, ...]:
        out = []
        for row, seen in enumerate(_as_list(positions, v.shape[0])):
            rows = _Rows()
            self.state.prefill(rows, mixer, v[row:row + 1], seen + v.shape[1])
            out.append([rows.recurrent_states[i] for i in sorted(rows.recurrent_states)])
        return tuple(torch.cat(parts) for parts in zip(*out))

    def step(self, states: tuple[torch.Tensor, ...], v_t: torch.Tensor, positions: int | torch.Tensor) -> torch.Tensor:
        outputs = []
        for row, seen in enumerate(_as_list(positions, v_t.shape[0])):
            rows = _Rows(tuple(s[row:row + 1] for s in states))  # views: the step writes into ``states``
            outputs.append(self.state.step(rows, self.mixer, v_t[row:row + 1], seen, None))
        return torch.cat(outputs)

    def chunk(self, mixer: TokenMixer, states: tuple[torch.Tensor, ...], v: torch.Tensor,
              positions: int | torch.Tensor) -> torch.Tensor:
        outputs = []
        for row, seen in enumerate(_as_list(positions, v.shape[0])):
            rows = _Rows(tuple(s[row:row + 1] for s in states))
            outputs.append(self.state.chunk(rows, mixer, v[row:row + 1], seen))
            for i, s in enumerate(states):  # the chunk replaces the tensors: copy them back
                s[row:row + 1] = rows.recurrent_states[i]
        return torch.cat(outputs)


def choose_plan(mode: str, mixer: TokenMixer, settings: PlanSettings, device: torch.device,
                dtype: torch.dtype) -> BridgedPlan:
    """``PLANNERS[mode].choose(...)`` with the per-row API."""
    return BridgedPlan(PLANNERS[mode].choose(mixer, settings, device, dtype), mixer)
