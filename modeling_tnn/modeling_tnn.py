"""Toeplitz Neural Network models for Hugging Face Transformers: blocks, the base model and its task heads (causal
LM, masked LM, sequence classification, token classification, question answering)."""

from __future__ import annotations

import inspect
import math

import torch
import torch.nn.functional as F
from torch import nn
from transformers import GenerationMixin, PreTrainedModel
from transformers import initialization as init
from transformers.modeling_outputs import (
    BaseModelOutputWithPast,
    CausalLMOutputWithPast,
    MaskedLMOutput,
    QuestionAnsweringModelOutput,
    SequenceClassifierOutput,
    TokenClassifierOutput,
)

from .checkpoint_layout import register_split_projection_loading
from .configuration_tnn import TnnConfig
from .decoding_cache import TnnCache
from .fit_plans import fit_plan
from .fit_plan_file import load_plan_file, save_with_plan
from .input_packing import CAUSAL_LM_LOSS_KEYWORDS, LOSS_KEYWORDS, backbone_documents, split_keywords
from .input_validation import validate_model_inputs
from .ops_documents import DocumentLayout, pool_documents
from .runtime import tracing
from .tnn_block import Dropout, TnnBlock, build_final_norm

# transformers 5.24 renamed the cache argument and output field `past_key_values` -> `cache`; support both.
CACHE_FIELD = "cache" if "cache" in CausalLMOutputWithPast.__dataclass_fields__ else "past_key_values"
_GENERATION_CACHE_KWARG = (
    "cache" if "cache" in inspect.signature(GenerationMixin.prepare_inputs_for_generation).parameters
    else "past_key_values"
)

AUTO_MAP = {
    "AutoConfig": "configuration_tnn.TnnConfig",
    "AutoModel": "modeling_tnn.TnnModel",
    "AutoModelForCausalLM": "modeling_tnn.TnnForCausalLM",
    "AutoModelForMaskedLM": "modeling_tnn.TnnForMaskedLM",
    "AutoModelForSequenceClassification": "modeling_tnn.TnnForSequenceClassification",
    "AutoModelForTokenClassification": "modeling_tnn.TnnForTokenClassification",
    "AutoModelForQuestionAnswering": "modeling_tnn.TnnForQuestionAnswering",
}

register_split_projection_loading()


class TnnPreTrainedModel(PreTrainedModel):
    """Weight initialisation, Auto-class wiring and Hub-ready saving shared by every TNN model."""

    config_class = TnnConfig
    base_model_prefix = "model"
    supports_gradient_checkpointing = True
    _no_split_modules = ["TnnBlock"]
    _supports_sdpa = False
    _supports_flash_attn = False
    _supports_flex_attn = False
    _can_compile_fullgraph = False
    _is_stateful = True  # recurrent decoding state: transformers refuses assisted generation, as for Mamba
    # (default causal value, allowed causal values) of each class: causal=None resolves on the model's own copy.
    _causal_default: bool = True
    _causal_allowed: tuple[bool, ...] = (True, False)

    def __init__(self, config: TnnConfig, *inputs, **kwargs):
        super().__init__(config.resolved_for(self._causal_default, self._causal_allowed, type(self).__name__),
                         *inputs, **kwargs)

    @torch.no_grad()
    def _init_weights(self, module: nn.Module) -> None:
        # PyTorch's default Linear init, as the paper: transformers' default (zero biases) collapses the RPE to
        # three distinct values (SimpleRMSNorm(w * p) = sign(p) w / rms(w)).
        if isinstance(module, nn.Linear):
            init.kaiming_uniform_(module.weight, a=math.sqrt(5))
            if module.bias is not None:
                bound = 1 / math.sqrt(module.weight.shape[1]) if module.weight.shape[1] > 0 else 0
                init.uniform_(module.bias, -bound, bound)
        elif isinstance(module, nn.Embedding):
            init.normal_(module.weight, mean=0.0, std=module.embedding_dim**-0.5)
            if module.padding_idx is not None and not getattr(module.weight, "_is_hf_initialized", False):
                module.weight[module.padding_idx].zero_()
        elif isinstance(module, nn.LayerNorm):
            init.ones_(module.weight)
            init.zeros_(module.bias)

    @classmethod
    def _supports_default_dynamic_cache(cls) -> bool:
        # A recurrent model: generate must not build a DynamicCache (KV) for it.
        return False

    def save_pretrained(self, save_directory, *args, **kwargs):
        """Save a Hub-ready folder: weights, config with an ``auto_map`` for every Auto class, and the model
        code, so the folder loads with ``trust_remote_code=True`` where ``modeling_tnn`` is not installed, and the
        decoding plan of the layers fitted for these weights (``decoding_plan.safetensors``; see
        :meth:`fit_decoding_plan`)."""
        self.config.auto_map = dict(AUTO_MAP)
        return save_with_plan(super().save_pretrained, self, save_directory, *args, **kwargs)

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, *args, **kwargs):
        """transformers' loading, then the decoding plan saved beside the weights, used while they match it."""
        model = super().from_pretrained(pretrained_model_name_or_path, *args, **kwargs)
        load_plan_file(model, pretrained_model_name_or_path, kwargs)
        return model

    def fit_decoding_plan(self, tolerance: float | None = None) -> dict:
        """Fit every layer's decoding plan now (:func:`~modeling_tnn.fit_plans.fit_plan`; ``tolerance`` becomes
        ``config.compact_tolerance``), e.g. before publishing: ``save_pretrained`` then ships it."""
        return fit_plan(self, tolerance)


class TnnModel(TnnPreTrainedModel):
    """The TNN backbone: token embeddings (no positional embeddings; scaled by ``sqrt(hidden_size)`` unless
    ``config.scale_embeddings`` is False, then a LayerNorm if ``config.embedding_layer_norm``), TNN blocks (pre- or
    post-norm, ``config.norm_placement``) and the final norm of ``config.final_norm`` (a LayerNorm by default)."""

    _auto_class = "AutoModel"

    def __init__(self, config: TnnConfig):
        super().__init__(config)
        config = self.config  # the resolved copy: the mixers are causal or not as the model is
        self.embeddings = nn.Embedding(config.vocab_size, config.hidden_size, padding_idx=config.pad_token_id)
        self.embed_scale = math.sqrt(config.hidden_size) if config.scale_embeddings else 1.0
        if config.embedding_layer_norm:  # absent otherwise: the state dict of today's models is unchanged
            self.embedding_norm = nn.LayerNorm(config.hidden_size)
        self.dropout = Dropout(config.dropout)
        self.layers = nn.ModuleList(TnnBlock(config, i) for i in range(config.num_hidden_layers))
        self.final_norm = build_final_norm(config)
        self.gradient_checkpointing = False
        self.post_init()

    def get_input_embeddings(self) -> nn.Embedding:
        return self.embeddings

    def set_input_embeddings(self, value: nn.Embedding) -> None:
        self.embeddings = value

    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        cache=None,
        past_key_values=None,
        use_cache: bool | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
        generation_cache: str | None = None,
        position_ids: torch.LongTensor | None = None,
        documents: DocumentLayout | None = None,
        **kwargs,
    ) -> BaseModelOutputWithPast | tuple:
        """Run the backbone. ``attention_mask`` is a 2-D padding mask (1 = token, 0 = padding); while decoding it
        may cover the cached past too (its last columns are this call's tokens).

        With ``use_cache=True`` (as ``generate`` passes) a causal model returns a :class:`TnnCache` in the
        ``generation_cache`` mode (``"auto"``, ``"etsc"`` or ``"exact"``; default ``config.generation_cache``); an
        eval-mode forward of a causal model returns one unless ``use_cache=False`` (or ``config.use_cache`` is
        False). Passing that cache back makes the next call continue the sequence in constant time per token.

        Packed batches (docs/packed-sequences.md): ``position_ids`` restarting at 0, ``cu_seq_lens_q/k`` with
        ``max_length_q/k`` or ``seq_idx`` (``DataCollatorWithFlattening``'s keywords), or a ``documents`` layout
        from a head, mix each document alone; other keywords: modeling_tnn.input_packing.
        """
        validate_model_inputs(input_ids, attention_mask, inputs_embeds,
                              vocab_size=getattr(self.embeddings, "num_embeddings", self.config.vocab_size),
                              hidden_size=self.config.hidden_size,
                              continues_cache=cache is not None or past_key_values is not None)
        output_hidden_states = (
            output_hidden_states if output_hidden_states is not None else self.config.output_hidden_states
        )
        return_dict = return_dict if return_dict is not None else self.config.return_dict
        cache = cache if cache is not None else past_key_values
        packing, _ = split_keywords(kwargs, type(self).__name__, self.config.causal, loss=())
        documents, use_cache = backbone_documents(documents, {"position_ids": position_ids, **packing},
                                                  input_ids if input_ids is not None else inputs_embeds,
                                                  attention_mask, cache is not None, use_cache)
        if inputs_embeds is None:
            inputs_embeds = self.embeddings(input_ids)
        length = inputs_embeds.shape[1]
        if attention_mask is not None and attention_mask.dim() == 2 and cache is not None:
            attention_mask = attention_mask[:, -length:]
        if cache is not None and not self.config.causal:
            raise ValueError("A bidirectional TNN (causal=False) cannot decode with a cache; pass use_cache=False.")
        # As transformers' recurrent models: a causal model returns its decoding state unless told not to (or
        # training), so that any forward can be continued.
        use_cache = use_cache if use_cache is not None else (self.config.use_cache and not self.training)
        if cache is None and use_cache and self.config.causal and not (self.training and torch.is_grad_enabled()):
            cache = TnnCache(self.config, mode=generation_cache)

        hidden_states = inputs_embeds * self.embed_scale if self.embed_scale != 1.0 else inputs_embeds
        if self.config.embedding_layer_norm:
            hidden_states = self.embedding_norm(hidden_states)
        hidden_states = self.dropout(hidden_states) if self.training else hidden_states  # a module call a step
        if cache is not None and not tracing():
            with cache.updating():  # a forward that fails part way leaves a cache no later call may read
                hidden_states, all_hidden_states = self._blocks(hidden_states, attention_mask, cache, documents,
                                                                output_hidden_states)
        else:
            hidden_states, all_hidden_states = self._blocks(hidden_states, attention_mask, cache, documents,
                                                            output_hidden_states)
        if cache is not None:
            cache.advance(length)

        output = BaseModelOutputWithPast(last_hidden_state=hidden_states, hidden_states=all_hidden_states,
                                         **{CACHE_FIELD: cache})
        return output if return_dict else output.to_tuple()

    def _blocks(self, hidden_states: torch.Tensor, attention_mask: torch.Tensor | None, cache: TnnCache | None,
                documents: DocumentLayout | None, output_hidden_states: bool
                ) -> tuple[torch.Tensor, tuple[torch.Tensor, ...] | None]:
        """The blocks and the final norm: the last hidden states, and every layer's input (and the output) when
        ``output_hidden_states``."""
        all_hidden_states = () if output_hidden_states else None
        for layer in self.layers:
            if output_hidden_states:
                all_hidden_states += (hidden_states,)
            hidden_states = layer(hidden_states, attention_mask=attention_mask, cache=cache, documents=documents)
        hidden_states = self.final_norm(hidden_states)
        if output_hidden_states:
            all_hidden_states += (hidden_states,)
        return hidden_states, all_hidden_states


class TnnForCausalLM(TnnPreTrainedModel, GenerationMixin):
    """TNN with a language-modelling head tied to the input embedding."""

    _auto_class = "AutoModelForCausalLM"
    _tied_weights_keys = {"lm_head.weight": "model.embeddings.weight"}
    _causal_default = True
    _causal_allowed = (True,)
    # False: transformers reads it as "DynamicCache/StaticCache work and compile", and TNN decodes with a TnnCache.
    # What compiles: generate(..., cache=TnnCache(config), compile_config=...) (docs/generation.md, test_export.py).
    _can_compile_fullgraph = False

    def __init__(self, config: TnnConfig):
        super().__init__(config)
        self.model = TnnModel(self.config)
        self.lm_head = nn.Linear(self.config.hidden_size, self.config.vocab_size, bias=False)
        self.post_init()

    def get_input_embeddings(self) -> nn.Embedding:
        return self.model.embeddings

    def set_input_embeddings(self, value: nn.Embedding) -> None:
        self.model.embeddings = value

    def get_output_embeddings(self) -> nn.Linear:
        return self.lm_head

    def set_output_embeddings(self, value: nn.Linear) -> None:
        self.lm_head = value

    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        cache=None,
        past_key_values=None,
        labels: torch.LongTensor | None = None,
        use_cache: bool | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
        logits_to_keep: int | torch.Tensor = 0,
        generation_cache: str | None = None,
        position_ids: torch.LongTensor | None = None,
        **kwargs,
    ) -> CausalLMOutputWithPast | tuple:
        """Causal LM forward; ``labels`` are the unshifted input ids (the loss shifts them), -100 is ignored. A packed
        batch (see :meth:`TnnModel.forward`) takes labels that are -100 at each document's first token, as
        DataCollatorWithFlattening writes them."""
        return_dict = return_dict if return_dict is not None else self.config.return_dict
        packing, kwargs = split_keywords(kwargs, type(self).__name__, self.config.causal, CAUSAL_LM_LOSS_KEYWORDS)
        outputs = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            inputs_embeds=inputs_embeds,
            cache=cache if cache is not None else past_key_values,
            use_cache=use_cache,
            output_hidden_states=output_hidden_states,
            return_dict=True,
            generation_cache=generation_cache,
            position_ids=position_ids,
            **packing,
        )
        hidden_states = outputs.last_hidden_state
        if isinstance(logits_to_keep, int):
            hidden_states = hidden_states[:, -logits_to_keep:] if logits_to_keep else hidden_states
        else:
            hidden_states = hidden_states[:, logits_to_keep]
        logits = self.lm_head(hidden_states)
        loss = None
        if labels is not None:
            loss = self.loss_function(logits=logits, labels=labels, vocab_size=self.config.vocab_size, **kwargs)
        output = CausalLMOutputWithPast(loss=loss, logits=logits, hidden_states=outputs.hidden_states,
                                        **{CACHE_FIELD: getattr(outputs, CACHE_FIELD)})
        return output if return_dict else output.to_tuple()

    def _prepare_cache_for_generation(self, generation_config, model_kwargs: dict, *args, **kwargs):
        """transformers' own cache preparation (none for a recurrent model: the first forward makes its cache), plus
        a :class:`TnnCache` up front where ``prefill_chunk_size`` asks for a chunked prefill, which continues one
        cache chunk by chunk (each chunk on the state, as cheap per token as one prefill: docs/generation.md)."""
        chunk = generation_config.prefill_chunk_size
        if chunk is not None and (isinstance(chunk, bool) or not isinstance(chunk, int) or chunk < 1):
            raise ValueError(f"prefill_chunk_size must be a positive integer (tokens per prefill chunk) or None "
                             f"(the whole prompt at once), got {chunk!r}.")
        result = super()._prepare_cache_for_generation(generation_config, model_kwargs, *args, **kwargs)
        if (chunk is not None and generation_config.use_cache is not False
                and model_kwargs.get(_GENERATION_CACHE_KWARG) is None):
            model_kwargs[_GENERATION_CACHE_KWARG] = TnnCache(self.config, mode=model_kwargs.get("generation_cache"),
                                                              model=self)
        return result

    def prepare_inputs_for_generation(self, input_ids, next_sequence_length=None, attention_mask=None,
                                      inputs_embeds=None, **kwargs):
        """Feed the model only the tokens its cache has not seen: transformers slices a continued prompt only for
        caches with attention layers, and a TNN cache is all recurrent, so a ``generate`` continued from a returned
        cache (full ``input_ids`` or ``inputs_embeds``) would otherwise feed the whole sequence into the filled
        state."""
        cache = kwargs.pop("cache", None)
        if cache is None:
            cache = kwargs.pop("past_key_values", None)
        seen = cache.get_seq_length() if isinstance(cache, TnnCache) else 0
        if seen == 0:
            next_sequence_length = None  # no recurrent state yet: the whole prefix goes through the FFT path
        else:
            total = inputs_embeds.shape[1] if inputs_embeds is not None and kwargs.get("is_first_iteration") \
                else input_ids.shape[1]
            if next_sequence_length is None and total > seen:
                next_sequence_length = total - seen  # a continued prompt: only what the cache has not seen
        model_inputs = super().prepare_inputs_for_generation(
            input_ids, next_sequence_length=next_sequence_length, attention_mask=None, inputs_embeds=inputs_embeds,
            **{_GENERATION_CACHE_KWARG: cache}, **kwargs
        )
        # Keep the 2-D padding mask (or none): transformers may build 4-D/dict attention masks in its place.
        model_inputs.pop("attention_mask", None)
        if attention_mask is not None:
            model_inputs["attention_mask"] = attention_mask
        return model_inputs


class TnnMaskedLMHead(nn.Module):
    """``decoder(LayerNorm(gelu(dense(x))))`` with the decoder tied to the input embedding."""

    def __init__(self, config: TnnConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.layer_norm = nn.LayerNorm(config.hidden_size)
        self.decoder = nn.Linear(config.hidden_size, config.vocab_size)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.decoder(self.layer_norm(F.gelu(self.dense(hidden_states))))


class TnnForMaskedLM(TnnPreTrainedModel):
    """Bidirectional TNN with a masked-language-modelling head."""

    _auto_class = "AutoModelForMaskedLM"
    _tied_weights_keys = {"lm_head.decoder.weight": "model.embeddings.weight"}
    _causal_default = False
    _causal_allowed = (False,)

    def __init__(self, config: TnnConfig):
        super().__init__(config)
        self.model = TnnModel(self.config)
        self.lm_head = TnnMaskedLMHead(self.config)
        self.post_init()

    def get_input_embeddings(self) -> nn.Embedding:
        return self.model.embeddings

    def set_input_embeddings(self, value: nn.Embedding) -> None:
        self.model.embeddings = value

    def get_output_embeddings(self) -> nn.Linear:
        return self.lm_head.decoder

    def set_output_embeddings(self, value: nn.Linear) -> None:
        self.lm_head.decoder = value

    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        labels: torch.LongTensor | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
        **kwargs,
    ) -> MaskedLMOutput | tuple:
        """Masked LM forward; ``labels`` hold the original ids at masked positions and -100 elsewhere."""
        return_dict = return_dict if return_dict is not None else self.config.return_dict
        packing, kwargs = split_keywords(kwargs, type(self).__name__, self.config.causal)
        outputs = self.model(input_ids=input_ids, attention_mask=attention_mask, inputs_embeds=inputs_embeds,
                             output_hidden_states=output_hidden_states, return_dict=True, **packing)
        logits = self.lm_head(outputs.last_hidden_state)
        loss = None
        if labels is not None:
            loss = self.loss_function(logits=logits, labels=labels, vocab_size=self.config.vocab_size, **kwargs)
        output = MaskedLMOutput(loss=loss, logits=logits, hidden_states=outputs.hidden_states)
        return output if return_dict else output.to_tuple()


class _TnnEncoderHead(TnnPreTrainedModel):
    """What the sequence, token and span heads share: the backbone, run without a cache on the padding mask
    (``attention_mask``, else ``input_ids != pad_token_id``), so every real token of a padded batch gets the output it
    gets when its row runs alone. Bidirectional by default; ``causal=True`` is allowed (a causal backbone, e.g. from a
    causal LM checkpoint, as transformers' decoder models also ship these heads)."""

    _causal_default = False

    def __init__(self, config: TnnConfig):
        super().__init__(config)
        self.model = TnnModel(self.config)

    def get_input_embeddings(self) -> nn.Embedding:
        return self.model.embeddings

    def set_input_embeddings(self, value: nn.Embedding) -> None:
        self.model.embeddings = value

    def _padding_mask(self, input_ids, attention_mask, inputs_embeds) -> torch.Tensor | None:
        """``attention_mask``, else ``input_ids != pad_token_id``, else all ones (None without inputs: the backbone
        then names what is missing)."""
        if attention_mask is not None:
            return attention_mask
        if input_ids is not None and self.config.pad_token_id is not None:
            return (input_ids != self.config.pad_token_id).long()
        reference = input_ids if input_ids is not None else inputs_embeds
        return None if reference is None else torch.ones(reference.shape[:2], dtype=torch.long,
                                                         device=reference.device)

    def _backbone(self, input_ids: torch.LongTensor | None, attention_mask: torch.Tensor | None,
                  inputs_embeds: torch.Tensor | None, output_hidden_states: bool | None, kwargs: dict,
                  loss: tuple[str, ...] = LOSS_KEYWORDS
                  ) -> tuple[BaseModelOutputWithPast, torch.Tensor | None, DocumentLayout | None, dict]:
        """The backbone's output, the padding mask it ran on, the documents of a packed batch (packed rows have no
        padding: no mask is inferred from pad ids) and the loss keywords of ``kwargs``."""
        packing, loss_kwargs = split_keywords(kwargs, type(self).__name__, self.config.causal, loss)
        documents = backbone_documents(None, packing, input_ids if input_ids is not None else inputs_embeds,
                                       attention_mask, False, False)[0] if packing else None
        mask = attention_mask if documents is not None else self._padding_mask(input_ids, attention_mask,
                                                                                inputs_embeds)
        outputs = self.model(input_ids=input_ids, attention_mask=mask, inputs_embeds=inputs_embeds, use_cache=False,
                             output_hidden_states=output_hidden_states, return_dict=True, documents=documents)
        return outputs, mask, documents, loss_kwargs


class TnnForSequenceClassification(_TnnEncoderHead):
    """TNN with a classification/regression head: ``score(drop(tanh(dense(drop(pool(h))))))``. With
    ``config.classifier_pooling="auto"`` causal models pool the last real token and bidirectional models take the
    mean over the real tokens; ``"mean"`` or ``"last"`` choose one for either direction. ``config.problem_type``
    selects regression, single- or multi-label classification."""

    _auto_class = "AutoModelForSequenceClassification"

    def __init__(self, config: TnnConfig):
        super().__init__(config)
        self.num_labels = self.config.num_labels
        self.dense = nn.Linear(self.config.hidden_size, self.config.hidden_size)
        self.dropout = Dropout(self.config.dropout)
        self.score = nn.Linear(self.config.hidden_size, self.config.num_labels)
        self.post_init()

    def pool(self, hidden_states: torch.Tensor, mask: torch.Tensor | None,
             documents: DocumentLayout | None = None) -> torch.Tensor:
        """The last real token (works for left and right padding) or the mean over the real tokens (``mask``: 1 =
        token), as ``config.classifier_pooling`` says (``"auto"``: last if causal, mean if bidirectional); for a
        packed batch, one row per document (``documents``)."""
        pooling = self.config.classifier_pooling
        if pooling == "auto":
            pooling = "last" if self.config.causal else "mean"
        if documents is not None:
            return pool_documents(hidden_states, documents, last=pooling == "last")
        if pooling == "last":
            positions = torch.arange(mask.shape[1], device=mask.device)
            last = (positions * (mask > 0)).argmax(dim=1)
            return hidden_states[torch.arange(hidden_states.shape[0], device=hidden_states.device), last]
        weights = mask.to(hidden_states.dtype)[..., None]
        return (hidden_states * weights).sum(dim=1) / weights.sum(dim=1).clamp(min=1)

    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
        **kwargs,
    ) -> SequenceClassifierOutput | tuple:
        """Classify whole sequences; ``labels`` are class ids, floats (regression) or multi-hot rows."""
        return_dict = return_dict if return_dict is not None else self.config.return_dict
        outputs, mask, documents, kwargs = self._backbone(input_ids, attention_mask, inputs_embeds,
                                                          output_hidden_states, kwargs)
        pooled = self.pool(outputs.last_hidden_state, mask, documents)
        logits = self.score(self.dropout(torch.tanh(self.dense(self.dropout(pooled)))))
        loss = None
        if labels is not None:
            loss = self.loss_function(labels=labels, pooled_logits=logits, config=self.config, **kwargs)
        output = SequenceClassifierOutput(loss=loss, logits=logits, hidden_states=outputs.hidden_states)
        return output if return_dict else output.to_tuple()


class TnnForTokenClassification(_TnnEncoderHead):
    """TNN with a linear classifier on every token (named-entity recognition, part-of-speech tagging):
    ``classifier(dropout(h_i))`` with ``config.num_labels`` classes."""

    _auto_class = "AutoModelForTokenClassification"

    def __init__(self, config: TnnConfig):
        super().__init__(config)
        self.num_labels = self.config.num_labels
        self.dropout = Dropout(self.config.dropout)
        self.classifier = nn.Linear(self.config.hidden_size, self.config.num_labels)
        self.post_init()

    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        labels: torch.LongTensor | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
        **kwargs,
    ) -> TokenClassifierOutput | tuple:
        """Score every token: ``logits`` of shape ``(batch, length, num_labels)``. ``labels`` hold one class id per
        token, -100 where no label applies (padding, special tokens, continuation sub-words); the loss is the mean
        cross-entropy over the labelled tokens (``num_items_in_batch`` from Trainer makes it a sum over that count).
        """
        return_dict = return_dict if return_dict is not None else self.config.return_dict
        outputs, _, _, kwargs = self._backbone(input_ids, attention_mask, inputs_embeds, output_hidden_states, kwargs)
        logits = self.classifier(self.dropout(outputs.last_hidden_state))
        loss = None
        if labels is not None:
            loss = self.loss_function(logits=logits, labels=labels, config=self.config, **kwargs)
        output = TokenClassifierOutput(loss=loss, logits=logits, hidden_states=outputs.hidden_states)
        return output if return_dict else output.to_tuple()


class TnnForQuestionAnswering(_TnnEncoderHead):
    """TNN for extractive question answering (SQuAD-style): a linear layer gives every token a start and an end
    score of the answer span."""

    _auto_class = "AutoModelForQuestionAnswering"

    def __init__(self, config: TnnConfig):
        super().__init__(config)
        self.qa_outputs = nn.Linear(self.config.hidden_size, 2)
        self.post_init()

    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        start_positions: torch.LongTensor | None = None,
        end_positions: torch.LongTensor | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
        **kwargs,
    ) -> QuestionAnsweringModelOutput | tuple:
        """Score answer spans: ``start_logits`` and ``end_logits`` of shape ``(batch, length)``. With both
        ``start_positions`` and ``end_positions`` (token indices, shape ``(batch,)``) the loss is the mean of the
        start and end cross-entropies; positions outside the input are clamped to its length and ignored."""
        return_dict = return_dict if return_dict is not None else self.config.return_dict
        outputs, _, documents, kwargs = self._backbone(input_ids, attention_mask, inputs_embeds,
                                                       output_hidden_states, kwargs, ("num_items_in_batch",))
        if documents is not None:
            raise ValueError("TnnForQuestionAnswering does not take packed batches (one question per row).")
        start_logits, end_logits = self.qa_outputs(outputs.last_hidden_state).unbind(dim=-1)
        start_logits, end_logits = start_logits.contiguous(), end_logits.contiguous()
        loss = None
        if start_positions is not None and end_positions is not None:
            loss = self.loss_function(start_logits=start_logits, end_logits=end_logits,
                                      start_positions=start_positions, end_positions=end_positions, **kwargs)
        output = QuestionAnsweringModelOutput(loss=loss, start_logits=start_logits, end_logits=end_logits,
                                              hidden_states=outputs.hidden_states)
        return output if return_dict else output.to_tuple()
