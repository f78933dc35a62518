"""A causal TNN inside vLLM: the same blocks as the transformers model, with each layer's decoding state in vLLM's
per-request state slots.

vLLM hands the model a packed batch: the tokens of every running request one after the other, decodes (one token
each) first, then prefills (a prompt, or the next chunk of one). Each GTU is a vLLM recurrent-state layer
(``MambaBase``): its slots hold the state its decoding plan keeps (:mod:`~modeling_tnn.decoding_plan`: the compact
window and modes of a decaying kernel, or the exact window of a fixed support), padded to one shape over the layers
(:mod:`~modeling_tnn.serving.state_slots`). Per batch it

- steps every decoding request's state in place, each at its own position (one call for all of them);
- fills the state of each new prompt from the mixer inputs, after the mixer's parallel path gave the outputs;
- continues the state of a prompt prefilled in chunks.

The maths is the plan's own (the functions transformers' cache calls), never a copy. The plan comes from the folder's
``decoding_plan.safetensors``; a folder without one fits it at load (logged). The embedding, norms, projections and
GLU are the transformers model's modules, loaded from the checkpoint's split projections.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from vllm.config import VllmConfig, get_current_vllm_config
from vllm.forward_context import get_forward_context
from vllm.model_executor.layers.mamba.abstract import MambaBase
from vllm.model_executor.models.interfaces import HasInnerState, IsAttentionFree
from vllm.v1.attention.backends.registry import MambaAttentionBackendEnum

from ..checkpoint_layout import fuse_projections
from ..decoding_plan import PLANNERS, PlanSettings
from ..fit_plan_file import PLAN_FILE, load_plan_file, plan_mixers
from ..ops_fused_gating import silu_mask
from ..tnn_block import Gtu, TnnBlock, build_final_norm
from .servable import SERVED_ARCHITECTURE, check_servable, growing_state
from .state_slots import gather_rows, padded_shapes, scatter_rows

# A child of vLLM's logger: vLLM prints what its own loggers say (level, format) and nothing of the others.
logger = logging.getLogger(f"vllm.{__name__}")

STATE_DTYPE = torch.float32  # every decoding state is float32, whatever the weights' dtype


class ServingGtu(Gtu, MambaBase):
    """The GTU ``W_o(silu(W_u x) * mixer(silu(W_v x)))`` with the mixer reading and writing each request's state in
    vLLM's slots (``kv_cache``: one tensor per state, ``(slots, *padded shape)``)."""

    def __init__(self, config, layer_idx: int, prefix: str):
        super().__init__(config, layer_idx)
        self.prefix = prefix
        forward_context = get_current_vllm_config().compilation_config.static_forward_context
        if prefix in forward_context:
            raise ValueError(f"Duplicate layer name: {prefix}")
        forward_context[prefix] = self  # where vLLM binds the layer's slots and finds its metadata
        self.kv_cache = (torch.tensor([]),)
        self.plan = None
        self.layer_shapes: tuple[tuple[int, ...], ...] = ()  # this layer's states
        self.slot_shapes: tuple[tuple[int, ...], ...] = ()   # every layer's, padded (what vLLM allocates)
        self.positions: torch.Tensor | None = None           # each token's position in its request (set per batch)

    # -- MambaBase: what vLLM allocates ----------------------------------------------------------------------------
    def get_state_shape(self) -> tuple[tuple[int, ...], ...]:
        if not self.slot_shapes:
            raise RuntimeError("the decoding plan is chosen when the weights load; vLLM asked for the state before")
        return self.slot_shapes

    def get_state_dtype(self) -> tuple[torch.dtype, ...]:
        return (STATE_DTYPE,) * len(self.slot_shapes)

    @property
    def mamba_type(self) -> MambaAttentionBackendEnum:
        # The short-convolution metadata carries what the states need: per-request slots, prefill offsets, and
        # whether each prefill continues a state.
        return MambaAttentionBackendEnum.SHORT_CONV

    # -- the layer ---------------------------------------------------------------------------------------------------
    def forward(self, x: torch.Tensor, attention_mask=None, cache=None, documents=None) -> torch.Tensor:
        """``x`` (tokens, hidden): the packed batch. As :meth:`Gtu.gate` without padding (none in a packed batch)."""
        u_pre, v_pre = self.uv_proj(x).chunk(2, dim=-1)
        mixed = self.mix_requests(silu_mask(v_pre, None))
        return self.o_proj(F.silu(u_pre) * mixed.to(u_pre.dtype))

    def mix_requests(self, v: torch.Tensor) -> torch.Tensor:
        """The mixer's outputs (tokens, c) for the packed mixer inputs ``v``, each request's state updated."""
        metadata = get_forward_context().attn_metadata
        metadata = metadata.get(self.prefix) if isinstance(metadata, dict) else None
        if metadata is None:  # vLLM's profiling run, before any slot exists: the parallel path, no state
            return self.token_mixer(v[None], None)[0]
        out = torch.zeros_like(v)  # tokens past the batch's (padding) stay zero
        decodes = metadata.num_decode_tokens
        if decodes:
            slots = metadata.state_indices_tensor_d[:, 0].long()
            rows = gather_rows(self.kv_cache, slots, self.layer_shapes)
            mixed, rows = self.plan.step(rows, v[:decodes], self.positions[:decodes])
            out[:decodes] = mixed.to(v.dtype)
            scatter_rows(self.kv_cache, slots, rows)
        if metadata.num_prefills:
            starts = (metadata.query_start_loc_p + decodes).tolist()
            continues = metadata.has_initial_states_p.tolist()
            for request, slot in enumerate(metadata.state_indices_tensor_p.long().split(1)):
                begin, end = starts[request], starts[request + 1]
                out[begin:end] = self._prefill(v[begin:end][None], slot, int(self.positions[begin]),
                                               continues[request])[0].to(v.dtype)
        return out

    def _prefill(self, v: torch.Tensor, slot: torch.Tensor, seen: int, continues: bool) -> torch.Tensor:
        """One request's prompt tokens ``v`` (1, n, c) after ``seen`` tokens: a first chunk runs the mixer's
        parallel path and fills the state; a later chunk continues the state."""
        if continues:
            out, rows = self.plan.chunk(self.token_mixer, gather_rows(self.kv_cache, slot, self.layer_shapes), v,
                                        seen)
            scatter_rows(self.kv_cache, slot, rows)
            return out
        scatter_rows(self.kv_cache, slot, self.plan.prefill(self.token_mixer, v, 0))
        return self.token_mixer(v, None)


class ServingBlock(TnnBlock):
    """The transformers block (its norms, GLU and residual order, pre- or post-norm) around a :class:`ServingGtu`."""

    def __init__(self, config, layer_idx: int, prefix: str):
        super().__init__(config, layer_idx)
        self.gtu = ServingGtu(config, layer_idx, f"{prefix}.gtu")


class ServingBackbone(nn.Module):
    """The modules of :class:`~modeling_tnn.TnnModel` under the same names (so the checkpoint's keys apply)."""

    def __init__(self, config, prefix: str):
        super().__init__()
        self.embeddings = nn.Embedding(config.vocab_size, config.hidden_size, padding_idx=config.pad_token_id)
        self.embed_scale = config.hidden_size ** 0.5 if config.scale_embeddings else 1.0
        if config.embedding_layer_norm:
            self.embedding_norm = nn.LayerNorm(config.hidden_size)
        self.layers = nn.ModuleList(ServingBlock(config, i, f"{prefix}.layers.{i}")
                                    for i in range(config.num_hidden_layers))
        self.final_norm = build_final_norm(config)


class TnnForCausalLM(nn.Module, HasInnerState, IsAttentionFree):
    """A saved causal TNN folder (dense or FD) as a vLLM text-generation model."""

    # The weights (one file or shards, as transformers saves them); not decoding_plan.safetensors beside them.
    allow_patterns_overrides = ["model*.safetensors"]

    def __init__(self, *, vllm_config: VllmConfig, prefix: str = ""):
        super().__init__()
        config = vllm_config.model_config.hf_config
        check_servable(config)
        self.config = config.resolved_for(True, (True,), SERVED_ARCHITECTURE)
        self.folder = vllm_config.model_config.model
        self.model = ServingBackbone(self.config, f"{prefix}.model" if prefix else "model")
        self.lm_head = nn.Linear(self.config.hidden_size, self.config.vocab_size, bias=False)
        self.lm_head.weight = self.model.embeddings.weight  # tied, as in transformers' TnnForCausalLM
        self.eval()  # dropout off; the mixers memoise their kernels in eval mode

    def embed_input_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        """As :meth:`TnnModel.forward`: the embedding, scaled, then its LayerNorm where the config has one."""
        hidden = self.model.embeddings(input_ids)
        hidden = hidden * self.model.embed_scale if self.model.embed_scale != 1.0 else hidden
        return self.model.embedding_norm(hidden) if self.config.embedding_layer_norm else hidden

    def forward(self, input_ids: torch.Tensor | None, positions: torch.Tensor, intermediate_tensors=None,
                inputs_embeds: torch.Tensor | None = None, **kwargs) -> torch.Tensor:
        hidden = inputs_embeds if inputs_embeds is not None else self.embed_input_ids(input_ids)
        for block in self.model.layers:
            block.gtu.positions = positions
            hidden = block(hidden)
        return self.model.final_norm(hidden)

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden_states)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """The checkpoint's tensors (split projections fused, as transformers loads them), then every layer's
        decoding plan. Returns the names of every parameter loaded; a missing or unknown tensor is an error."""
        parameters = dict(self.named_parameters(remove_duplicate=False))
        loaded = set()
        with torch.no_grad():
            for name, tensor in fuse_projections(dict(weights)).items():
                if name not in parameters:
                    raise ValueError(f"{self.folder}: the checkpoint tensor {name!r} is no parameter of "
                                     f"{SERVED_ARCHITECTURE}")
                parameters[name].copy_(tensor)
                loaded.add(name)
        loaded.add("lm_head.weight")  # the embedding's, tied
        missing = sorted(set(parameters) - loaded)
        if missing:
            raise ValueError(f"{self.folder}: the checkpoint lacks {missing}")
        self.eval()
        self._choose_plans()
        return loaded

    def _choose_plans(self) -> None:
        """Every layer's decoding plan (shipped beside the weights, or fitted now) and the slots' padded shapes."""
        needs_tail = plan_mixers(self.model)
        if Path(self.folder, PLAN_FILE).is_file():
            load_plan_file(self.model, self.folder, {})
        elif needs_tail and PLANNERS[self.config.generation_cache].reads_tail:
            logger.warning("%s has no %s: fitting the decoding plan of %d layers at load (save one with "
                           "model.fit_decoding_plan(); model.save_pretrained(folder)).", self.folder, PLAN_FILE,
                           len(needs_tail))
        settings = PlanSettings(etsc_length=self.config.etsc_length, tolerance=self.config.compact_tolerance)
        device = self.model.embeddings.weight.device
        gtus = [block.gtu for block in self.model.layers]
        planner = PLANNERS[self.config.generation_cache]
        with torch.no_grad():
            for gtu in gtus:
                gtu.plan = planner.choose(gtu.token_mixer, settings, device, STATE_DTYPE)
                problem = growing_state(gtu.plan, gtu.layer_idx, self.config.generation_cache)
                if problem is not None:
                    raise ValueError(f"modeling_tnn's vLLM plugin refuses {self.folder}: {problem}.")
                gtu.layer_shapes = gtu.plan.state_shapes(gtu.token_mixer.channels)
        slot_shapes = padded_shapes([gtu.layer_shapes for gtu in gtus])
        for gtu in gtus:
            gtu.slot_shapes = slot_shapes
        logger.info("TNN decoding states per request: %s (float32)", slot_shapes)


class TnnRefused(TnnForCausalLM):
    """Registered for the TNN architectures vLLM cannot serve: building it raises the reason (the config hook of
    :mod:`~modeling_tnn.serving.vllm_registration` raises it first, while vLLM reads the config)."""

    def __init__(self, *, vllm_config: VllmConfig, prefix: str = ""):
        nn.Module.__init__(self)
        check_servable(vllm_config.model_config.hf_config)
        raise ValueError(f"{vllm_config.model_config.architecture} cannot be served by vLLM")
