"""Convert the TNN authors' fairseq checkpoints (``OpenNLPLab/fairseq-evo``) into Hub-ready folders.

Supported: the causal LM of the ``tnn_v2_lm`` model (``tnn_v2_decay_99_pre`` and the variants that only change sizes
or the decay) as :class:`~modeling_tnn.TnnForCausalLM`, and the ``roberta_tnn_v2`` masked LM as
:class:`~modeling_tnn.TnnForMaskedLM`, among them the published BLM ``roberta_tnn_v2_decay_99``. The block choices
of either are read from the arguments into the config (:func:`block_options`): ``{side}_normalize_before`` gives
``norm_placement`` (pre-norm, or post-norm with a SimpleRMSNorm after each residual add), ``no_scale_embedding`` gives
``scale_embeddings``, ``layernorm_embedding`` gives ``embedding_layer_norm`` (its ``layernorm_embedding.{weight,bias}``
map to ``model.embedding_norm``), and fairseq's rule for the final LayerNorm (present only for a pre-norm stack, and
for a decoder only without ``no_decoder_final_norm``) gives ``final_norm`` (``"layernorm"`` or ``"none"``). The
published BLM thus converts as post-norm, with an embedding LayerNorm, unscaled embeddings and no final norm.

Every tensor of the checkpoint is accounted for: it maps to one of our parameters (:data:`NAME_RULES`), or it is one
of the fairseq-only entries that are checked and dropped (the decoder/encoder ``version`` buffer and each layer's
fixed decay ``toep.gamma``); a tied output projection must equal the input embedding. Anything else is refused by name,
and so is any parameter of ours that the checkpoint does not provide, and any tensor whose shape differs from the one
the sizes in ``args``/``cfg`` give.

The reference's fixed decay is an ``nn.Parameter(requires_grad=False)`` of shape ``(heads, 1, channels / heads)``
holding gamma itself in every entry (``gamma ** k`` is computed at run time). Ours is computed from
``config.decay_gamma``: the conversion requires one value across every entry and layer, equal to ``args.gamma`` in the
checkpoint's precision, and stores ``args.gamma`` (or, where a half-precision checkpoint rounded it, the stored value:
the gamma the model trained with).

This module is conversion tooling: the model modules never import it, so ``save_pretrained`` does not copy it as
remote code.
"""

from __future__ import annotations

import dataclasses
import re
import shutil
from collections.abc import Mapping
from pathlib import Path

import torch

from ...configuration_tnn import TnnConfig
from ...checkpoint_layout import fuse_projections, split_projections
from ...modeling_tnn import TnnForCausalLM, TnnForMaskedLM, TnnPreTrainedModel
from .checkpoint import (
    BACKBONE_PREFIX,
    CAUSAL_LM,
    MASKED_LM,
    architecture_differences,
    build_config,
    build_dictionary_tokenizer,
    checkpoint_args,
    checkpoint_kind,
    load_fairseq_checkpoint,
)

# Our parameter name (a regex) -> the fairseq name (a template; `{B}` is the backbone prefix). Every parameter of
# TnnForCausalLM / TnnForMaskedLM, in the layout checkpoints are saved in (the GTU's and GLU's fused input
# projections split in two, checkpoint_layout.split_projections), matches exactly one rule of its kind.
_BLOCK_RULES = [
    (r"model\.embeddings\.weight", "{B}embed_tokens.weight"),
    (r"model\.embedding_norm\.(weight|bias)", r"{B}layernorm_embedding.\1"),
    (r"model\.final_norm\.(weight|bias)", r"{B}layer_norm.\1"),
    (r"model\.layers\.(\d+)\.gtu\.u_proj\.(weight|bias)", r"{B}layers.\1.self_attn.gtu.u_proj.\2"),
    (r"model\.layers\.(\d+)\.gtu\.v_proj\.(weight|bias)", r"{B}layers.\1.self_attn.gtu.v_proj.\2"),
    (r"model\.layers\.(\d+)\.gtu\.o_proj\.(weight|bias)", r"{B}layers.\1.self_attn.gtu.o.\2"),
    (r"model\.layers\.(\d+)\.gtu\.token_mixer\.rpe\.pos_proj\.(weight|bias)",
     r"{B}layers.\1.self_attn.gtu.toep.rpe.pos_proj.\2"),
    # The reference's RPE stages are Sequential(norm, activation, Linear): the Linear is item 2.
    (r"model\.layers\.(\d+)\.gtu\.token_mixer\.rpe\.layers\.(\d+)\.(weight|bias)",
     r"{B}layers.\1.self_attn.gtu.toep.rpe.layers.\2.2.\3"),
    (r"model\.layers\.(\d+)\.gtu\.token_mixer\.rpe\.out_proj\.(weight|bias)",
     r"{B}layers.\1.self_attn.gtu.toep.rpe.out.2.\2"),
    # GLU: W3(silu(W1 x) * W2 x); the reference's l1 is the gated (activated) branch.
    (r"model\.layers\.(\d+)\.glu\.gate_proj\.(weight|bias)", r"{B}layers.\1.glu.l1.\2"),
    (r"model\.layers\.(\d+)\.glu\.up_proj\.(weight|bias)", r"{B}layers.\1.glu.l2.\2"),
    (r"model\.layers\.(\d+)\.glu\.down_proj\.(weight|bias)", r"{B}layers.\1.glu.l3.\2"),
]
NAME_RULES: dict[str, list[tuple[str, str]]] = {
    CAUSAL_LM: _BLOCK_RULES + [(r"lm_head\.weight", "decoder.output_projection.weight")],
    MASKED_LM: _BLOCK_RULES + [
        (r"lm_head\.dense\.(weight|bias)", r"encoder.lm_head.dense.\1"),
        (r"lm_head\.layer_norm\.(weight|bias)", r"encoder.lm_head.layer_norm.\1"),
        (r"lm_head\.decoder\.weight", "encoder.lm_head.weight"),
        (r"lm_head\.decoder\.bias", "encoder.lm_head.bias"),
    ],
}
# Our output-embedding parameter (tied to model.embeddings.weight unless the checkpoint unties it).
OUTPUT_EMBEDDING = {CAUSAL_LM: "lm_head.weight", MASKED_LM: "lm_head.decoder.weight"}


@dataclasses.dataclass
class ConversionResult:
    """What :func:`convert_fairseq_checkpoint` wrote: the kind of model, its config, where it went, and the notes on
    behaviour that differs from the reference on inputs the reference handles differently (padding)."""

    kind: str
    config: TnnConfig
    output_dir: Path
    num_tensors: int
    notes: list[str]
    tokenizer_written: bool


def fairseq_name(our_name: str, kind: str) -> str:
    """The fairseq state-dict name of one of our parameters (``ValueError`` if no rule maps it)."""
    for pattern, template in NAME_RULES[kind]:
        if re.fullmatch(pattern, our_name):
            return re.sub(pattern, template.replace("{B}", BACKBONE_PREFIX[kind]), our_name)
    raise ValueError(f"No fairseq name for our parameter {our_name!r}.")


def map_state_dict(state_dict: Mapping[str, torch.Tensor], model: TnnPreTrainedModel, kind: str,
                   use_decay: bool) -> dict[str, torch.Tensor]:
    """Our state dict (in the saved layout: projections split) from the fairseq one, for ``model`` (built from the checkpoint's config); with ``use_decay``
    every layer must hold its fixed ``toep.gamma`` (its values are checked by :func:`decay_gamma`).

    Raises one ``ValueError`` naming every unknown key and every missing one, then one naming every shape mismatch
    (the fairseq key, its shape, our key and the shape the sizes give).
    """
    prefix = BACKBONE_PREFIX[kind]
    ours = split_projections(model.state_dict())
    tied = bool(model.config.tie_word_embeddings)
    output_key = OUTPUT_EMBEDDING[kind]
    expected = {fairseq_name(name, kind): name for name in ours}
    # fairseq-only entries, checked and dropped: the version buffer and each layer's fixed decay.
    gamma_keys = {f"{prefix}layers.{i}.self_attn.gtu.toep.gamma" for i in range(model.config.num_hidden_layers)}
    extra = {prefix + "version"} | (gamma_keys if use_decay else set())
    dropped = extra & set(state_dict)
    unknown = sorted(set(state_dict) - set(expected) - dropped)
    optional = {fairseq_name(output_key, kind)} if tied else set()  # an older checkpoint may omit a tied copy
    missing = sorted((set(expected) | extra) - set(state_dict) - optional)
    if unknown or missing:
        lines = []
        if unknown:
            lines.append(f"unknown key(s), with no counterpart in {type(model).__name__}: {unknown}")
        if missing:
            lines.append(f"missing key(s), which {type(model).__name__} needs: {missing}")
        raise ValueError("The checkpoint's tensors do not match the model its arguments describe:\n  - "
                         + "\n  - ".join(lines))
    if model.config.final_norm == "layernorm":
        _check_version(state_dict[prefix + "version"], prefix + "version", kind)

    mapped, mismatched = {}, []
    for fs_key, our_key in expected.items():
        if fs_key not in state_dict:  # the tied output embedding, absent from an older checkpoint
            continue
        tensor = state_dict[fs_key]
        if tuple(tensor.shape) != tuple(ours[our_key].shape):
            mismatched.append(f"{fs_key} has shape {tuple(tensor.shape)}, our {our_key} needs "
                              f"{tuple(ours[our_key].shape)}")
        mapped[our_key] = tensor
    for key in sorted(dropped - {prefix + "version"}):
        channels = state_dict[key].numel()
        width = model.config.gtu_dim
        if channels != width:
            mismatched.append(f"{key} has shape {tuple(state_dict[key].shape)} ({channels} values), the GTU has "
                              f"{width} channels")
    if mismatched:
        raise ValueError("Shape mismatch between the checkpoint and the sizes in its arguments:\n  - "
                         + "\n  - ".join(mismatched))
    embed_key = "model.embeddings.weight"
    if tied:
        if output_key in mapped and not torch.equal(mapped[output_key], mapped[embed_key]):
            raise ValueError(f"The arguments tie the output embedding to the input embedding, but "
                             f"{fairseq_name(output_key, kind)} differs from {fairseq_name(embed_key, kind)}.")
        mapped[output_key] = mapped[embed_key]
    return mapped


def _check_version(version: torch.Tensor, key: str, kind: str) -> None:
    # fairseq drops the final LayerNorm of a checkpoint whose version is below 2 (encoder) or at most 2 (decoder);
    # checked only where the arguments describe a final LayerNorm (a post-norm stack has none to drop).
    value = float(version.flatten()[0])
    too_old = value <= 2 if kind == CAUSAL_LM else value < 2
    if too_old:
        raise ValueError(f"{key} is {value:g}: fairseq loads such an old checkpoint without its final LayerNorm, "
                         "which the model its arguments describe has (final_norm='layernorm').")


BEHAVIOUR_NOTES = [
    "Padding: the reference ignores padding (its GTU mixes pad positions in); ours zeroes them, so outputs agree on "
    "unpadded inputs (and on right-padded causal inputs) and ours stay exact on padded batches.",
    "Precision: our RPE and FFT run in at least float32; the weights are saved in float32.",
]


def convert_fairseq_checkpoint(checkpoint_path: str | Path, output_dir: str | Path,
                               dictionary_path: str | Path | None = None, trust_checkpoint: bool = False,
                               overwrite: bool = False) -> ConversionResult:
    """Convert a fairseq TNN checkpoint into a Hub-ready folder: ``config.json`` with ``auto_map``, the model code,
    ``model.safetensors``, and (with ``dictionary_path``) a tokenizer built from fairseq's ``dict.txt``.

    Raises ``ValueError`` for an architecture that differs from ours, unknown or missing keys, mismatched shapes or
    decay values, and a non-empty ``output_dir`` without ``overwrite``.
    """
    output_dir = Path(output_dir)
    if output_dir.exists() and any(output_dir.iterdir()) and not overwrite:
        raise ValueError(f"{output_dir} is not empty; pass --overwrite (overwrite=True) to replace it.")
    checkpoint = load_fairseq_checkpoint(checkpoint_path, trust_checkpoint=trust_checkpoint)
    if not isinstance(checkpoint, Mapping) or not isinstance(checkpoint.get("model"), Mapping):
        raise ValueError(f"{checkpoint_path} is not a fairseq checkpoint: no `model` state dict.")
    state_dict = {k: v for k, v in checkpoint["model"].items()}
    non_tensors = sorted(k for k, v in state_dict.items() if not isinstance(v, torch.Tensor))
    if non_tensors:
        raise ValueError(f"The state dict holds non-tensor entries: {non_tensors}.")
    kind = checkpoint_kind(state_dict)
    args = checkpoint_args(checkpoint)
    problems = architecture_differences(args, kind)
    if problems:
        name = "TnnForCausalLM" if kind == CAUSAL_LM else "TnnForMaskedLM"
        raise ValueError(f"This {args.get('arch', 'fairseq')} checkpoint cannot be converted exactly into {name}; "
                         "converting it would give a different model:\n  - " + "\n  - ".join(problems))
    config = build_config(args, kind, state_dict)
    model_class = TnnForCausalLM if kind == CAUSAL_LM else TnnForMaskedLM
    model = model_class(config)
    mapped = map_state_dict(state_dict, model, kind, use_decay=bool(args.get("use_decay", False)))
    model.load_state_dict(fuse_projections({k: v.to(torch.float32) for k, v in mapped.items()}), strict=True)
    model.eval()
    tokenizer = None
    if dictionary_path is not None:
        tokenizer = build_dictionary_tokenizer(dictionary_path, config.vocab_size, kind)
    if output_dir.exists() and overwrite:
        shutil.rmtree(output_dir)
    model.save_pretrained(output_dir)
    if tokenizer is not None:
        tokenizer.save_pretrained(output_dir)
    notes = list(BEHAVIOUR_NOTES)
    if kind == MASKED_LM:
        notes.append("Classification: the folder loads as TnnForSequenceClassification with classifier_pooling='mean' "
                     "(the mean over the real tokens); the reference's head averages every position, pads included, "
                     "so the two agree on unpadded inputs.")
    if config.decay_gamma != float(args.get("gamma", 0.99)) and args.get("use_decay", False):
        notes.append(f"decay_gamma is {config.decay_gamma!r}: the value the checkpoint's decay tensors hold "
                     f"(args.gamma={args.get('gamma')!r} rounded to their precision), what the model trained with.")
    return ConversionResult(kind=kind, config=model.config, output_dir=output_dir, num_tensors=len(state_dict),
                            notes=notes, tokenizer_written=tokenizer is not None)
