"""Reading the TNN authors' fairseq checkpoints: the file (weights only), its arguments, the kind of model, the
:class:`~modeling_tnn.TnnConfig` they describe (:func:`block_options` reads the block choices), and fairseq's
dictionary as a tokenizer. :mod:`.conversion` maps the tensors and writes the folder."""

from __future__ import annotations

import argparse
import pickle
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from tokenizers import Tokenizer, models, pre_tokenizers, processors
from transformers import PreTrainedTokenizerFast

from ...configuration_tnn import TnnConfig

# fairseq's Dictionary puts these four symbols first, at ids 0-3, before the lines of dict.txt.
FAIRSEQ_SPECIAL_SYMBOLS = ("<s>", "<pad>", "</s>", "<unk>")
BOS_ID, PAD_ID, EOS_ID, UNK_ID = range(4)
# The masked-LM task appends this symbol after the dictionary's lines.
MASK_SYMBOL = "<mask>"
# Only this non-tensor type is allowed into the weights-only unpickler: the old checkpoint format's `args`.
SAFE_GLOBALS = [argparse.Namespace]
CAUSAL_LM, MASKED_LM = "causal_lm", "masked_lm"
# Where the backbone lives in each kind of checkpoint.
BACKBONE_PREFIX = {CAUSAL_LM: "decoder.", MASKED_LM: "encoder.sentence_encoder."}
GAMMA_KEY = re.compile(r"layers\.(\d+)\.self_attn\.gtu\.toep\.gamma$")


def load_fairseq_checkpoint(path: str | Path, trust_checkpoint: bool = False) -> dict[str, Any]:
    """Load a fairseq checkpoint on the CPU.

    By default with ``torch.load(weights_only=True)``, allowing one non-tensor class, ``argparse.Namespace`` (the old
    format's ``args``; the new format's ``cfg`` is a plain dict). A checkpoint that needs any other class (an
    omegaconf ``DictConfig``, numpy scalars in ``extra_state``) is refused with the class named, unless
    ``trust_checkpoint=True``, which unpickles everything (``weights_only=False``: it can run code, so only for
    files you trust).
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"No fairseq checkpoint at {path}.")
    if trust_checkpoint:
        return torch.load(path, map_location="cpu", weights_only=False)
    try:
        with torch.serialization.safe_globals(SAFE_GLOBALS):
            return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as err:
        blocked = re.findall(r"GLOBAL ([\w.]+)", str(err))
        what = f"the class {blocked[0]}" if blocked else "an object the weights-only unpickler does not allow"
        raise ValueError(
            f"{path} holds {what} besides its tensors, so it cannot be read with torch.load(weights_only=True) "
            "(only argparse.Namespace is allowed). If you trust the file, pass --trust_checkpoint "
            "(trust_checkpoint=True): it unpickles everything, which can run code."
        ) from None


def checkpoint_args(checkpoint: Mapping[str, Any]) -> dict[str, Any]:
    """The model's arguments: ``args`` (an ``argparse.Namespace``, old format) or ``cfg["model"]`` (new format; a
    dict, an omegaconf config or a Namespace), as a plain dict."""
    source = checkpoint.get("args")
    if source is None:
        cfg = checkpoint.get("cfg")
        if cfg is not None:
            cfg = _plain(cfg)
            source = cfg.get("model") if isinstance(cfg, Mapping) else None
    if source is None:
        raise ValueError("The checkpoint has neither `args` nor `cfg['model']`: its sizes and architecture cannot be "
                         "read, so it is not converted.")
    source = _plain(source)
    if not isinstance(source, Mapping):
        raise ValueError(f"The checkpoint's model arguments are a {type(source).__name__}, not a Namespace or dict.")
    return dict(source)


def _plain(value: Any) -> Any:
    if isinstance(value, argparse.Namespace):
        return vars(value)
    if type(value).__module__.startswith("omegaconf"):  # only loadable with trust_checkpoint
        from omegaconf import OmegaConf

        try:
            return OmegaConf.to_container(value, resolve=True)
        except Exception:  # a Namespace inside the config: keep its items as they are
            return dict(value.items())
    return value


def checkpoint_kind(state_dict: Mapping[str, Any]) -> str:
    """``"causal_lm"`` for a ``decoder.*`` state dict, ``"masked_lm"`` for an ``encoder.sentence_encoder.*`` one."""
    if any(k.startswith(BACKBONE_PREFIX[CAUSAL_LM]) for k in state_dict):
        return CAUSAL_LM
    if any(k.startswith(BACKBONE_PREFIX[MASKED_LM]) for k in state_dict):
        return MASKED_LM
    heads = sorted({k.split(".")[0] for k in state_dict})
    raise ValueError(f"Not a TNN language model checkpoint: no `decoder.*` (tnn_v2_lm) or `encoder.sentence_encoder.*` "
                     f"(roberta_tnn_v2) tensors; its top-level names are {heads}.")


def _is_none_name(value: Any) -> bool:
    return value is None or str(value).lower() == "none"


def architecture_differences(args: Mapping[str, Any], kind: str) -> list[str]:
    """The ways the checkpoint's model differs from ours beyond what the conversion maps exactly (empty: convertible).

    Arguments a checkpoint lacks take the reference code's own defaults.
    """
    get = args.get
    side = "decoder" if kind == CAUSAL_LM else "encoder"
    problems = []

    def expect(name: str, default: Any, wanted: Any, why: str) -> None:
        value = get(name, default)
        ok = wanted(value) if callable(wanted) else value == wanted
        if not ok:
            problems.append(f"{name}={value!r}: {why}")

    for name in (f"{side}_embed_dim", f"{side}_layers"):
        if get(name) is None:
            problems.append(f"{name} is missing from the checkpoint's arguments: the sizes cannot be read")
    if get(f"{side}_normalize_before") is None:
        problems.append(f"{side}_normalize_before is missing from the checkpoint's arguments: the block's norm "
                        "placement (pre- or post-norm) cannot be read")
    expect("no_token_positional_embeddings", False, True,
           "the reference adds positional embeddings; ours has none")
    expect("norm_type", "layernorm", "simplermsnorm",
           "the block norms are not the parameter-free SimpleRMSNorm our blocks use")
    expect("act_fun", "silu", "silu", "the GTU's activation is not SiLU")
    expect("glu_act", "silu", "silu", "the GLU's activation is not SiLU")
    expect("fina_act", "None", _is_none_name, "the GLU has a final activation; ours has none")
    expect("glu_type", 1, 1, "GLUV2 (two linears) is not our GLU")
    expect("gtu_type", 1, lambda v: v in (None, 1), "only the v2 GTU maps to ours")
    expect("rpe_act", "relu", "relu", "the RPE's activation is not ReLU")
    expect("par_type", 1, 1, "the RPE reads scaled lags; ours reads the raw integer lag")
    expect("residual", False, lambda v: not v, "the RPE stages are residual; ours are not")
    expect("act_type", "none", _is_none_name, "an activation is applied to the Toeplitz kernel; ours has none")
    expect("use_norm", False, lambda v: not v, "the GTU normalises u * TNO(v); ours does not")
    expect("resi_param", False, lambda v: not v, "the GTU has a residual parameter; ours has none")
    expect("normalize", False, lambda v: not v, "the TNO output is divided by T 1; ours is not")
    expect("use_multi_decay", False, lambda v: not v,
           "the decay is learned per channel; ours is one fixed gamma (decay_gamma)")
    expect("bias", True, True, "the linear layers have no biases; ours do")
    expect("causal", kind == CAUSAL_LM, kind == CAUSAL_LM,
           f"a {'causal' if kind == CAUSAL_LM else 'bidirectional'} model needs causal={kind == CAUSAL_LM}")
    expect("quant_noise_pq", 0, lambda v: not v, "quant-noise adds a projection of the embeddings")
    if kind == CAUSAL_LM:
        dims = {name: get(name) for name in ("decoder_input_dim", "decoder_output_dim") if get(name) is not None}
        if any(v != get("decoder_embed_dim") for v in dims.values()):
            problems.append(f"{dims} differ from decoder_embed_dim={get('decoder_embed_dim')!r}: the reference "
                            "projects in and out; ours has one width")
        expect("adaptive_input", False, lambda v: not v, "adaptive input embeddings are not ours")
        expect("adaptive_softmax_cutoff", None, lambda v: v is None, "an adaptive softmax is not our LM head")
        expect("character_embeddings", False, lambda v: not v, "character embeddings are not ours")
    else:
        expect("activation_fn", "gelu", "gelu", "the masked-LM head's activation is not the exact GELU ours uses")
    return problems


def block_options(args: Mapping[str, Any], kind: str) -> dict[str, Any]:
    """The config's architecture options for the checkpoint's block, from its arguments (fairseq's own rules):

    - ``norm_placement``: ``"pre"`` if ``{side}_normalize_before`` else ``"post"`` (the reference layer normalises
      after each residual add, with the same parameter-free SimpleRMSNorm);
    - ``scale_embeddings``: ``not no_scale_embedding`` (fairseq's ``embed_scale`` is ``sqrt(d)`` or 1);
    - ``embedding_layer_norm``: ``layernorm_embedding`` (a LayerNorm after the scale, before the dropout);
    - ``final_norm``: ``"layernorm"`` where fairseq builds the stack's final ``layer_norm`` (a pre-norm encoder; a
      pre-norm decoder without ``no_decoder_final_norm``), else ``"none"``;
    - ``classifier_pooling``: ``"mean"`` for the masked LM, whose classification head
      (``RobertaClassificationNoClsHead``) averages the positions instead of reading ``<s>``.
    """
    side = "decoder" if kind == CAUSAL_LM else "encoder"
    pre_norm = bool(args.get(f"{side}_normalize_before"))
    final = pre_norm and not (kind == CAUSAL_LM and bool(args.get("no_decoder_final_norm", False)))
    options = dict(norm_placement="pre" if pre_norm else "post",
                   scale_embeddings=not bool(args.get("no_scale_embedding", False)),
                   embedding_layer_norm=bool(args.get("layernorm_embedding", False)),
                   final_norm="layernorm" if final else "none")
    if kind == MASKED_LM:
        options["classifier_pooling"] = "mean"
    return options


def build_config(args: Mapping[str, Any], kind: str, state_dict: Mapping[str, torch.Tensor]) -> TnnConfig:
    """Our :class:`TnnConfig` from the checkpoint's arguments (the vocabulary size from its embedding, the decay from
    its fixed ``toep.gamma`` values, see :func:`decay_gamma`, the block's norms and embedding scale from
    :func:`block_options`)."""
    side = "decoder" if kind == CAUSAL_LM else "encoder"
    prefix = BACKBONE_PREFIX[kind]
    embed = state_dict.get(prefix + "embed_tokens.weight")
    if embed is None:
        raise ValueError(f"Missing key(s): ['{prefix}embed_tokens.weight'] (the token embedding).")
    hidden = int(args[f"{side}_embed_dim"])
    glu_dim = int(args.get("glu_dim", -1) or -1)
    glu_dim = hidden if glu_dim == -1 else glu_dim
    glu_ratio = glu_dim / hidden
    if int(glu_ratio * hidden) != glu_dim:
        raise ValueError(f"glu_dim={glu_dim} is not representable as glu_expand_ratio * hidden_size ({hidden}).")
    if kind == CAUSAL_LM:
        tied = bool(args.get("share_decoder_input_output_embed", False))
    else:
        tied = not bool(args.get("untie_weights_roberta", False))
    return TnnConfig(
        vocab_size=int(embed.shape[0]),
        hidden_size=hidden,
        num_hidden_layers=int(args[f"{side}_layers"]),
        gtu_expand_ratio=args.get("expand_ratio", 3),
        glu_expand_ratio=glu_ratio if glu_ratio != int(glu_ratio) else int(glu_ratio),
        rpe_dim=int(args.get("rpe_embedding", 64)),
        rpe_layers=int(args.get("rpe_layers", 6)),
        decay_gamma=decay_gamma(args, state_dict),
        token_mixer="dense",
        causal=kind == CAUSAL_LM,
        dropout=float(args.get("dropout", 0.1) or 0.0),
        pad_token_id=PAD_ID,
        bos_token_id=BOS_ID,
        eos_token_id=EOS_ID,
        tie_word_embeddings=tied,
        **block_options(args, kind),
    )


def decay_gamma(args: Mapping[str, Any], state_dict: Mapping[str, torch.Tensor]) -> float:
    """The decay our config must hold: 1.0 without ``use_decay``; otherwise the one value every layer's fixed
    ``toep.gamma`` holds, which must equal ``args.gamma`` in that tensor's precision (else ``ValueError``)."""
    gammas = {k: v for k, v in state_dict.items() if GAMMA_KEY.search(k)}
    if not args.get("use_decay", False):
        if gammas:
            raise ValueError(f"use_decay is off but the checkpoint holds decay tensors: {sorted(gammas)}.")
        return 1.0
    if not gammas:
        raise ValueError("use_decay is on but the checkpoint holds no `...self_attn.gtu.toep.gamma` tensor.")
    wanted = float(args.get("gamma", 0.99))
    problems, values = [], set()
    for key, tensor in sorted(gammas.items()):
        distinct = torch.unique(tensor.detach().float().flatten()).tolist()
        if len(distinct) != 1:
            problems.append(f"{key} holds {len(distinct)} different values (min {min(distinct)}, max {max(distinct)})")
            continue
        if distinct[0] != torch.tensor(wanted, dtype=tensor.dtype).float().item():
            problems.append(f"{key} holds {distinct[0]!r}, not args.gamma={wanted!r} in {tensor.dtype}")
        values.add(distinct[0])
    if not problems and len(values) > 1:
        problems.append(f"the layers hold different gammas {sorted(values)}; our config has one decay_gamma")
    if problems:
        raise ValueError("The fixed decay does not match one gamma (ours computes gamma**|k| from "
                         "config.decay_gamma):\n  - " + "\n  - ".join(problems))
    value = values.pop()
    # args.gamma itself where our float32 decay computes the same; else the stored (half-precision) value.
    return wanted if torch.tensor(wanted, dtype=torch.float32).item() == value else value


def read_fairseq_dictionary(path: str | Path) -> list[str]:
    """The symbols of a fairseq ``dict.txt`` in id order: the four specials (``<s> <pad> </s> <unk>`` at 0-3), then
    one symbol per ``symbol count [#fairseq:overwrite]`` line. A duplicate symbol without the overwrite flag is an
    error, as in fairseq; with it the symbol moves to the new id and its old id keeps a placeholder."""
    symbols = list(FAIRSEQ_SPECIAL_SYMBOLS)
    index = {s: i for i, s in enumerate(symbols)}
    for number, raw in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), start=1):
        line = raw.rstrip()
        if not line:
            continue
        overwrite = line.endswith(" #fairseq:overwrite")
        if overwrite:
            line = line[: -len(" #fairseq:overwrite")]
        symbol, _, count = line.rpartition(" ")
        if not symbol or not count.lstrip("-").isdigit():
            raise ValueError(f"{path}:{number}: expected `symbol count`, got {raw!r}.")
        if symbol in index:
            if not overwrite:
                raise ValueError(f"{path}:{number}: duplicate symbol {symbol!r} (fairseq needs #fairseq:overwrite).")
            symbols[index[symbol]] = f"<fairseq_overwritten_{index[symbol]}>"
        index[symbol] = len(symbols)
        symbols.append(symbol)
    return symbols


def build_dictionary_tokenizer(path: str | Path, vocab_size: int, kind: str) -> PreTrainedTokenizerFast:
    """A ``PreTrainedTokenizerFast`` (a ``tokenizers`` WordLevel model) mapping the dictionary's symbols to the
    model's ids: text is split on whitespace and each piece looked up (unknown pieces -> ``<unk>``).

    It maps fairseq *symbols*, not raw text: for a GPT-2 BPE dictionary the symbols are GPT-2 BPE ids, so text must
    go through fairseq's GPT-2 BPE encoder first (e.g. ``"464 2068"``). The masked LM's ``<mask>`` follows the
    dictionary's lines, as fairseq's masked-LM task adds it; masked-LM inputs are wrapped in ``<s> ... </s>`` as in
    RoBERTa, causal-LM inputs are left as they are (fairseq ends each line with ``</s>``).
    """
    symbols = read_fairseq_dictionary(path)
    if kind == MASKED_LM and len(symbols) + 1 == vocab_size:
        symbols.append(MASK_SYMBOL)
    if len(symbols) != vocab_size:
        raise ValueError(f"The dictionary {path} gives {len(symbols)} ids (4 specials + its lines"
                         f"{' + <mask>' if kind == MASKED_LM else ''}), the checkpoint's embedding has {vocab_size} "
                         "rows.")
    tokenizer = Tokenizer(models.WordLevel({s: i for i, s in enumerate(symbols)}, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    special = {"bos_token": "<s>", "pad_token": "<pad>", "eos_token": "</s>", "unk_token": "<unk>"}
    if kind == MASKED_LM:
        special["mask_token"] = MASK_SYMBOL
        tokenizer.post_processor = processors.TemplateProcessing(
            single="<s> $A </s>", pair="<s> $A </s> </s> $B </s>",
            special_tokens=[("<s>", BOS_ID), ("</s>", EOS_ID)])
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, clean_up_tokenization_spaces=False, **special)
