"""The generation cache of causal TNNs: one :class:`TnnCacheLayer` per layer, each holding its decoding state
(:mod:`~modeling_tnn.decoding_state`), chosen at the layer's first cached forward by :mod:`~modeling_tnn.decoding_plan`.

:func:`mix_with_cache` is what a GTU calls when decoding: the prompt runs the parallel path and fills the state, a
token steps it, several tokens run as a chunk. The cache is a pytree of its tensors for torch.export / torch.compile.
"""

from __future__ import annotations

import contextlib
import json
import warnings
from collections.abc import Iterator

import torch
from transformers.cache_utils import Cache, LinearAttentionCacheLayerMixin

from .configuration_tnn import GENERATION_CACHE_MODES
from .decoding_plan import PLANNERS, PlanSettings, plan_source
from .decoding_state import STATE_CLASSES, DecodingState, States
from .mixer_base import TokenMixer
from .runtime import as_dtype, compute_dtype


class TnnCacheLayer(LinearAttentionCacheLayerMixin):
    """One layer's decoding state: ``state`` (None before the first forward) is the plan, with the plan's numbers and
    the kernel constants; the state tensors, batch first, are ``recurrent_states[0]`` (a window of past mixer inputs
    (b, W, c), or the complex SSM state (b, c, M)) and, for the compact state, ``recurrent_states[1]`` (its modes).
    The layer alone reads and writes them; the plan's functions take and return them."""

    # Whether the state's shapes stay fixed from the prefill on is the cache's to say (TnnCache.is_compileable).
    is_compileable = False

    def __init__(self):
        super().__init__(number_of_states=2)
        self.state: DecodingState | None = None
        self.plan_source: str | None = None  # where the layer's modal tail came from (TnnCache.describe)

    def states(self) -> States:
        """The state tensors, in the plan's order."""
        first, second = self.recurrent_states[0], self.recurrent_states[1]
        return (first,) if second is None else (first, second)

    def set_states(self, states: States) -> None:
        """Hold ``states`` (what the plan's prefill, step or chunk returned)."""
        for state_idx, state in enumerate(states):
            self.update_recurrent_state(state, state_idx)

    def state_bytes(self) -> int:
        """Bytes of this layer's decoding state, the whole batch (not the constants, which the weights fix)."""
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
        """Repeat every batch row ``repeats`` times in place of it (``generate``'s expansion for beams/samples)."""
        for i, state in self.recurrent_states.items():
            if state is not None:
                self.recurrent_states[i] = state.repeat_interleave(repeats, dim=0)
                self.batch_size = self.recurrent_states[i].shape[0]

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        """Keep the batch rows ``indices`` (beam search, batch selection): every state tensor is batch first."""
        for i, state in self.recurrent_states.items():
            if state is not None:
                self.recurrent_states[i] = state.index_select(0, indices.to(state.device))
                self.batch_size = self.recurrent_states[i].shape[0]

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        self.batch_select_indices(beam_idx)


class TnnCache(Cache):
    """transformers ``Cache`` for TNN generation, in ``mode`` ``"auto"``, ``"compact"``, ``"etsc"`` or ``"exact"``
    (see :class:`~modeling_tnn.TnnConfig`'s ``generation_cache``). ``get_seq_length()`` counts every token seen,
    padding included. ``model``: the model it will decode, whose mixers say whether their states keep fixed shapes
    (:attr:`is_compileable`) before the first forward; without it that is known from the first forward on."""

    def __init__(self, config, mode: str | None = None, model: torch.nn.Module | None = None):
        mode = mode or config.generation_cache
        if mode not in GENERATION_CACHE_MODES:
            raise ValueError(f"generation_cache must be one of {GENERATION_CACHE_MODES}, got {mode!r}.")
        super().__init__(layers=[TnnCacheLayer() for _ in range(config.num_hidden_layers)])
        self.mode = mode
        self.settings = PlanSettings(config.etsc_length, getattr(config, "compact_tolerance", 1e-5))
        self._seen = 0
        # The same count as a tensor, (1,) int64, from the prefill on: a compiled step reads its ring slots from it,
        # since a Python int would specialise the graph on its value (see decoding_window.ring_slot).
        self.seen_counter: torch.Tensor | None = None
        self._warned = False
        self._unbounded = False  # no layer's plan has a horizon (advance stops looking)
        self.failure: str | None = None  # why a forward stopped part way through this cache (it is then unusable)
        mixers = [] if model is None else [m for m in model.modules() if isinstance(m, TokenMixer)]
        self._declared_fixed = bool(mixers) and all(PLANNERS[mode].keeps_shapes(mixer) for mixer in mixers)

    @property
    def is_compileable(self) -> bool:
        """True where every layer's state keeps its shapes from the prefill on (the compact plan or a window of the
        kernel's support: FD, or a dense kernel that decays, in ``"auto"``, ``"compact"`` or ``"exact"``): a
        ``torch.compile``'d decode step is then one graph without breaks for every token, and ``generate`` takes
        its compiled path (``compile_config``; on CPU with ``compile_config._compile_all_devices = True``). False
        for ETSC's SSM (a window until the period fills, then a complex state) and a history that grows. Before
        the first forward, what the ``model``'s mixers declare (False without one)."""
        states = [layer.state for layer in self.layers]
        if any(state is None for state in states):
            return self._declared_fixed
        return all(state.fixed_shapes for state in states)

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
        certified relative l1 error of the layer's kernel, its largest channel's; None where the plan is exact) and
        ``plan_source`` (where the modal tail the plan was chosen from came from: ``"checkpoint"``, the plan saved
        with the weights; ``"fitted"``; ``"refitted"``, a saved plan whose weights have changed since; None where no
        tail was read: the ``"exact"`` and ``"etsc"`` modes, or a mixer that offers none)."""
        rows = []
        for layer in self.layers:
            row = (dict(plan=None, window=None, modes=None, error_bound=None) if layer.state is None
                   else layer.state.describe())
            rows.append(dict(plan=row["plan"], window=row["window"], modes=row["modes"],
                             state_bytes=layer.state_bytes(), error_bound=row["error_bound"],
                             plan_source=layer.plan_source))
        return rows

    @contextlib.contextmanager
    def updating(self) -> Iterator[None]:
        """Around one forward's update of every layer: refuses a cache a failed forward left half-updated (some layers
        past the tokens, some not), and marks this one so if the forward fails."""
        if self.failure is not None:
            raise ValueError(f"cache: a forward failed part way through this cache ({self.failure}), leaving its "
                             "layers at different positions; start a new cache (a fresh forward or generate).")
        try:
            yield
        except BaseException as error:
            self.failure = f"{type(error).__name__}: {error}"
            raise

    def advance(self, tokens: int) -> None:
        """Count ``tokens`` more seen tokens; warn once when an inexact plan passes its horizon."""
        self._seen += tokens
        if self.seen_counter is not None:
            self.seen_counter.add_(tokens)
        if self._warned or self._unbounded:
            return
        states = [layer.state for layer in self.layers]
        horizons = {state.horizon for state in states if state is not None} - {None}
        # Every layer planned and none with a horizon: nothing to watch (the set costs ~25 us a step otherwise).
        self._unbounded = not horizons and all(state is not None for state in states)
        if horizons and self._seen_tokens > min(horizons):
            self._warned = True
            warnings.warn(
                f"TNN generation passed the ETSC horizon of {min(horizons)} tokens (etsc_length): this kernel does "
                "not decay (decay_gamma=1, or generation_cache='etsc' with token_mixer='fd'), so the SSM's kernel "
                "repeats beyond it and outputs drift from the no-cache forward. For exact decoding pass "
                "generation_cache='exact' (to generate or the config), or raise etsc_length.",
                UserWarning, stacklevel=2,
            )


def mix_with_cache(mixer: TokenMixer, v: torch.Tensor, attention_mask: torch.Tensor | None, layer: TnnCacheLayer,
                   cache: TnnCache) -> torch.Tensor:
    """The token mixer's output for ``v`` (b, n, c; pad positions zero), reading and writing ``layer``'s state."""
    seen = cache.get_seq_length()
    state = layer.state
    if state is None:
        state = layer.state = PLANNERS[cache.mode].choose(mixer, cache.settings, v.device, compute_dtype(v.dtype))
        layer.plan_source = plan_source(cache.mode, mixer, cache.settings, v.device)
    if not layer.has_previous_state[0]:
        # Prefill: the parallel FFT path over the prompt, and the state at its end directly from the prompt.
        if cache.seen_counter is None:
            cache.seen_counter = torch.full((1,), seen, dtype=torch.long, device=v.device)
        out = mixer(v, attention_mask)
        layer.set_states(state.prefill(mixer, v))
        return out
    # A compiled step reads the position from the counter tensor: a Python int would specialise its graph on the
    # value (a recompilation per token), where a tensor leaves one graph for every step. The count goes along for
    # what only branches on it (the compact state's fold: dynamo guards the branch, a graph for the steps that fold
    # and one for the rest); not under export, whose one step must serve every position.
    compiling = torch.compiler.is_compiling()
    positions = cache.seen_counter if compiling else seen
    host_count = seen if compiling and not torch.compiler.is_exporting() else None
    states = layer.states()
    if v.shape[1] == 1:
        if not state.fixed_shapes:
            states = state.reserve(mixer, states, seen)
        if state.STEPS_TOKEN_ROWS:
            out, after = state.step(states, v, positions, host_count)
        else:
            out, after = state.step(states, v[:, 0], positions, host_count)
            out = out[:, None]
        out = as_dtype(out, v.dtype)
    else:  # several new tokens on a filled state: their own part in parallel, plus what the past contributes
        out, after = state.chunk(mixer, states, v, positions)
    if after is not states:
        layer.set_states(after)
    return out


# -- torch.export / torch.compile: the cache as a pytree of its tensors ----------------------------------------------
# The context holds only plain values (each state as its plan's name and numbers), so that torch.export can serialise
# it; the tensors are the leaves: the seen counter, then each layer's two state tensors and its state's constants.


def _layer_context(layer: TnnCacheLayer):
    state = layer.state
    numbers = None if state is None else (state.PLAN, tuple(state.numbers().items()))
    return numbers, layer.has_previous_state[0], layer.plan_source


def _flatten_cache(cache: TnnCache):
    children = [cache.seen_counter]
    for layer in cache.layers:
        constants = [] if layer.state is None else layer.state.constants()
        children += [layer.recurrent_states[0], layer.recurrent_states[1], *constants]
    context = (cache.mode, cache.settings.etsc_length, cache.settings.tolerance, cache._seen_tokens, cache._warned,
               cache._declared_fixed, tuple(_layer_context(layer) for layer in cache.layers))
    return children, context


def _unflatten_cache(children, context) -> TnnCache:
    mode, etsc_length, tolerance, seen, warned, declared_fixed, layers = context
    cache = TnnCache.__new__(TnnCache)
    Cache.__init__(cache, layers=[TnnCacheLayer() for _ in layers])
    cache.mode, cache.settings = mode, PlanSettings(etsc_length, tolerance)
    cache._seen, cache._warned, cache._declared_fixed, cache._unbounded = seen, warned, declared_fixed, False
    cache.seen_counter, children = children[0], children[1:]
    for layer, (numbers, has_state, source) in zip(cache.layers, layers):
        layer.plan_source = source
        state_class = None if numbers is None else STATE_CLASSES[numbers[0]]
        width = 2 + (0 if state_class is None else len(state_class.CONSTANTS))
        (window, modes, *constants), children = children[:width], children[width:]
        if state_class is not None:
            layer.state = state_class.rebuilt(dict(numbers[1]), constants)
        for state_idx, state in enumerate((window, modes)):
            if state is not None:
                layer.update_recurrent_state(state, state_idx)
        layer.has_previous_state[0] = has_state
    return cache


def _dumpable_context(context) -> str:
    mode, etsc_length, tolerance, seen, warned, declared_fixed, layers = context
    return json.dumps([mode, etsc_length, tolerance, int(seen), warned, declared_fixed,
                       [[numbers, has, source] for numbers, has, source in layers]])


def _loaded_context(dumped: str):
    mode, etsc_length, tolerance, seen, warned, declared_fixed, layers = json.loads(dumped)
    return (mode, etsc_length, tolerance, seen, warned, declared_fixed,
            tuple((None if numbers is None else (numbers[0], tuple(map(tuple, numbers[1]))), has, source)
                  for numbers, has, source in layers))


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
