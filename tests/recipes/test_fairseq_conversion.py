"""Converting the authors' fairseq checkpoints (OpenNLPLab/fairseq-evo): synthetic checkpoints with the reference's
key names and argument names, converted, loaded through the Auto classes, and compared with a forward pass written
here from the reference's definitions on the reference's own tensor names; and the refusals."""

from __future__ import annotations

import argparse
import json
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from transformers import AutoModelForCausalLM, AutoModelForMaskedLM, AutoTokenizer

from modeling_tnn import TnnForCausalLM
from modeling_tnn.recipes.fairseq.checkpoint import build_config
from modeling_tnn.recipes.fairseq.conversion import convert_fairseq_checkpoint

from tests.support import script_main
from tests.remote_code import run_with_package_blocked

WORDS = [f"w{i}" for i in range(20)]  # dict.txt lines: ids 4..23 (24 rows; 25 with the masked LM's <mask>)
LM = "decoder."
BLM = "encoder.sentence_encoder."


def lm_args(**overrides) -> argparse.Namespace:
    """The arguments of tnn_v2_decay_99_pre after fairseq's base_lm_architecture, at test sizes."""
    values = dict(arch="tnn_v2_decay_99_pre", task="language_modeling", decoder_embed_dim=16, decoder_input_dim=16,
                  decoder_output_dim=16, decoder_layers=2, decoder_attention_heads=1, decoder_normalize_before=True,
                  no_token_positional_embeddings=True, no_scale_embedding=False, layernorm_embedding=False,
                  share_decoder_input_output_embed=True, adaptive_input=False, adaptive_softmax_cutoff=None,
                  character_embeddings=False, no_decoder_final_norm=False, quant_noise_pq=0, act_fun="silu",
                  causal=True, expand_ratio=2, use_norm=False, norm_type="simplermsnorm", use_decay=True, gamma=0.99,
                  rpe_embedding=8, rpe_layers=2, residual=False, glu_act="silu", glu_dim=16, dropout=0.1)
    values.update(overrides)
    return argparse.Namespace(**values)


def blm_args(**overrides) -> dict:
    """roberta_tnn_v2_decay_99 after RoBERTa's base_architecture (post-norm), at test sizes."""
    values = dict(arch="roberta_tnn_v2_decay_99", task="masked_lm", encoder_embed_dim=16, encoder_layers=2,
                  encoder_attention_heads=2, encoder_normalize_before=False, layernorm_embedding=True,
                  no_scale_embedding=True, no_token_positional_embeddings=True, activation_fn="gelu",
                  untie_weights_roberta=False, quant_noise_pq=0, toep_type=1, expand_ratio=2, use_decay=True,
                  gamma=0.99, use_norm=False, norm_type="simplermsnorm", rpe_embedding=8, rpe_layers=2,
                  residual=False, glu_act="silu", glu_dim=16, dropout=0.1)
    values.update(overrides)
    return values


PRE_NORM_BLM = dict(encoder_normalize_before=True, layernorm_embedding=False, no_scale_embedding=False)


def reference_state(prefix: str, d: int = 16, layers: int = 2, width: int = 32, rpe: int = 8, rpe_layers: int = 2,
                    glu: int = 16, vocab: int = 24, heads: int = 1, gamma: float = 0.99) -> dict[str, torch.Tensor]:
    """Random tensors under the reference's names (TransformerDecoder/Encoder > TnnV2*Layer > GtuV2Module > GtuV2 >
    Tno > Rpe, and GLU)."""
    g = torch.Generator().manual_seed(1)

    def rand(*shape):
        return torch.randn(*shape, generator=g) * 0.3

    sd = {prefix + "version": torch.tensor([3.0]), prefix + "embed_tokens.weight": rand(vocab, d)}
    for i in range(layers):
        p = f"{prefix}layers.{i}."
        for name, shape in (("u_proj", (width, d)), ("v_proj", (width, d)), ("o", (d, width))):
            sd[f"{p}self_attn.gtu.{name}.weight"], sd[f"{p}self_attn.gtu.{name}.bias"] = rand(*shape), rand(shape[0])
        sd[p + "self_attn.gtu.toep.gamma"] = torch.ones(heads, 1, width // heads) * gamma
        r = p + "self_attn.gtu.toep.rpe."
        sd[r + "pos_proj.weight"], sd[r + "pos_proj.bias"] = rand(rpe, 1), rand(rpe)
        for j in range(rpe_layers):
            sd[f"{r}layers.{j}.2.weight"], sd[f"{r}layers.{j}.2.bias"] = rand(rpe, rpe), rand(rpe)
        sd[r + "out.2.weight"], sd[r + "out.2.bias"] = rand(width, rpe), rand(width)
        for name, shape in (("l1", (glu, d)), ("l2", (glu, d)), ("l3", (d, glu))):
            sd[f"{p}glu.{name}.weight"], sd[f"{p}glu.{name}.bias"] = rand(*shape), rand(shape[0])
    return sd


def lm_state(**kwargs) -> dict[str, torch.Tensor]:
    sd = reference_state(LM, **kwargs)
    d = sd[LM + "embed_tokens.weight"].shape[1]
    sd[LM + "layer_norm.weight"], sd[LM + "layer_norm.bias"] = 1 + 0.1 * torch.randn(d), 0.1 * torch.randn(d)
    sd[LM + "output_projection.weight"] = sd[LM + "embed_tokens.weight"]  # shared, as fairseq saves it
    return sd


def blm_state(final_norm: bool = True, layernorm_embedding: bool = False, **kwargs) -> dict[str, torch.Tensor]:
    sd = reference_state(BLM, vocab=25, heads=2, **kwargs)
    d = sd[BLM + "embed_tokens.weight"].shape[1]
    names = ["encoder.lm_head.layer_norm"]
    names += [BLM + "layer_norm"] if final_norm else []
    names += [BLM + "layernorm_embedding"] if layernorm_embedding else []
    for name in names:
        sd[name + ".weight"], sd[name + ".bias"] = 1 + 0.1 * torch.randn(d), 0.1 * torch.randn(d)
    sd["encoder.lm_head.dense.weight"], sd["encoder.lm_head.dense.bias"] = torch.randn(d, d) * 0.3, torch.randn(d)
    sd["encoder.lm_head.weight"] = sd[BLM + "embed_tokens.weight"]
    sd["encoder.lm_head.bias"] = 0.1 * torch.randn(25)
    return sd


# -- the reference's forward, from its definitions, on its own tensor names -----------------------------------------


def _linear(sd, name, x):
    return F.linear(x, sd[name + ".weight"], sd[name + ".bias"])


def _srms(x):  # the reference's SimpleRMSNorm: x / (||x|| d^-1/2 + 1e-8), no parameters
    return x / (x.norm(dim=-1, keepdim=True) * x.shape[-1] ** -0.5 + 1e-8)


def reference_backbone(sd: dict, prefix: str, ids: torch.Tensor, layers: int, rpe_layers: int, causal: bool,
                       pre_norm: bool = True, scale: bool = True, embed_norm: bool = False, final_norm: bool = True):
    """The reference TNN stack. Pre-norm (``normalize_before``): scaled embeddings, [x += GTU(norm x);
    x += GLU(norm x)] per layer, final LayerNorm. Post-norm (RoBERTa's ``roberta_tnn_v2_decay_99``): embeddings
    scaled by 1 (``no_scale_embedding``), ``layernorm_embedding``, [x = norm(x + GTU(x)); x = norm(x + GLU(x))], no
    final LayerNorm (fairseq builds it only for a pre-norm stack)."""
    emb = sd[prefix + "embed_tokens.weight"]
    x = emb[ids] * (math.sqrt(emb.shape[1]) if scale else 1.0)
    if embed_norm:
        x = F.layer_norm(x, (x.shape[-1],), sd[prefix + "layernorm_embedding.weight"],
                         sd[prefix + "layernorm_embedding.bias"])
    n = ids.shape[1]
    lags = torch.arange(-(n - 1), n, dtype=torch.float32)
    offsets = torch.arange(n)[:, None] - torch.arange(n)[None, :] + (n - 1)  # T[i, j] = t[i - j]
    for i in range(layers):
        p = f"{prefix}layers.{i}."
        h = _srms(x) if pre_norm else x
        u, v = F.silu(_linear(sd, p + "self_attn.gtu.u_proj", h)), F.silu(_linear(sd, p + "self_attn.gtu.v_proj", h))
        z = _linear(sd, p + "self_attn.gtu.toep.rpe.pos_proj", lags[:, None])
        for j in range(rpe_layers):
            z = _linear(sd, f"{p}self_attn.gtu.toep.rpe.layers.{j}.2", F.relu(_srms(z)))
        t = _linear(sd, p + "self_attn.gtu.toep.rpe.out.2", F.relu(_srms(z)))  # (2n-1, channels)
        gamma = sd[p + "self_attn.gtu.toep.gamma"].flatten()  # (heads, 1, e) -> channels in (h e) order
        t = t * gamma[None, :] ** lags.abs()[:, None]
        if causal:
            t = t * (lags >= 0)[:, None]
        mixed = torch.einsum("ijc,bjc->bic", t[offsets], v)
        x = x + _linear(sd, p + "self_attn.gtu.o", u * mixed)
        if not pre_norm:
            x = _srms(x)  # self_attn_layer_norm after the residual add
        h = _srms(x) if pre_norm else x
        x = x + _linear(sd, p + "glu.l3", F.silu(_linear(sd, p + "glu.l1", h)) * _linear(sd, p + "glu.l2", h))
        if not pre_norm:
            x = _srms(x)  # final_layer_norm after the residual add
    if not final_norm:
        return x
    d = x.shape[-1]
    return F.layer_norm(x, (d,), sd[prefix + "layer_norm.weight"], sd[prefix + "layer_norm.bias"])


def reference_lm_logits(sd, ids, **block):
    return reference_backbone(sd, LM, ids, 2, 2, causal=True, **block) @ sd[LM + "output_projection.weight"].T


def reference_mlm_logits(sd, ids, **block):
    x = F.gelu(_linear(sd, "encoder.lm_head.dense", reference_backbone(sd, BLM, ids, 2, 2, causal=False, **block)))
    x = F.layer_norm(x, (x.shape[-1],), sd["encoder.lm_head.layer_norm.weight"], sd["encoder.lm_head.layer_norm.bias"])
    return x @ sd["encoder.lm_head.weight"].T + sd["encoder.lm_head.bias"]


# -- helpers -----------------------------------------------------------------------------------------------------


def save_checkpoint(path, state, args=None, cfg=None, **extra):
    checkpoint = {"model": state, "optimizer_history": [{"num_updates": 10}], "extra_state": {"epoch": 1}, **extra}
    if cfg is not None:
        checkpoint.update(args=None, cfg=cfg)
    else:
        checkpoint["args"] = args
    torch.save(checkpoint, path)
    return path


def write_dictionary(path, words=WORDS):
    path.write_text("".join(f"{w} {100 - i}\n" for i, w in enumerate(words)), encoding="utf-8")
    return path


IDS = torch.tensor([[5, 9, 4, 17, 22, 8, 6], [11, 12, 13, 14, 15, 16, 23]])


# -- conversions -------------------------------------------------------------------------------------------------


def test_causal_lm_converts_loads_and_matches_the_reference_forward(tmp_path):
    state = lm_state()
    ckpt = save_checkpoint(tmp_path / "checkpoint_best.pt", state, args=lm_args())
    out = tmp_path / "hf"
    result = convert_fairseq_checkpoint(ckpt, out, dictionary_path=write_dictionary(tmp_path / "dict.txt"))
    assert result.kind == "causal_lm" and result.tokenizer_written
    files = {p.name for p in out.iterdir()}
    assert {"config.json", "model.safetensors", "modeling_tnn.py", "configuration_tnn.py", "tokenizer.json"} <= files
    assert "fairseq_conversion.py" not in files  # conversion tooling is never remote code
    saved = json.loads((out / "config.json").read_text())
    assert saved["auto_map"]["AutoModelForCausalLM"] == "modeling_tnn.TnnForCausalLM"
    assert (saved["vocab_size"], saved["decay_gamma"], saved["pad_token_id"], saved["eos_token_id"]) == (
        24, 0.99, 1, 2)
    expected = reference_lm_logits(state, IDS)
    for trust in (False, True):
        model = AutoModelForCausalLM.from_pretrained(out, trust_remote_code=trust).eval()
        gate, up = model.model.layers[1].glu.gate_up_proj.weight.chunk(2, dim=0)  # W1 (l1) first, W2 (l2) second
        assert torch.equal(gate, state[LM + "layers.1.glu.l1.weight"])
        assert torch.equal(up, state[LM + "layers.1.glu.l2.weight"])
        assert torch.equal(model.model.layers[0].gtu.o_proj.bias, state[LM + "layers.0.self_attn.gtu.o.bias"])
        assert model.lm_head.weight.data_ptr() == model.model.embeddings.weight.data_ptr()  # still tied
        with torch.no_grad():
            logits = model(IDS, use_cache=False).logits
        torch.testing.assert_close(logits, expected, atol=1e-5, rtol=1e-5)


def test_untied_lm_keeps_its_own_output_projection(tmp_path):
    state = lm_state()
    state[LM + "output_projection.weight"] = torch.randn_like(state[LM + "embed_tokens.weight"])
    ckpt = save_checkpoint(tmp_path / "ckpt.pt", state, args=lm_args(share_decoder_input_output_embed=False))
    convert_fairseq_checkpoint(ckpt, tmp_path / "hf")
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "hf")
    assert not model.config.tie_word_embeddings
    assert torch.equal(model.lm_head.weight, state[LM + "output_projection.weight"])
    with torch.no_grad():
        torch.testing.assert_close(model.eval()(IDS, use_cache=False).logits, reference_lm_logits(state, IDS),
                                   atol=1e-5, rtol=1e-5)


def test_pre_norm_masked_lm_in_the_new_cfg_format_converts(tmp_path):
    state = blm_state()
    cfg = {"common": {"fp16": False}, "model": blm_args(**PRE_NORM_BLM), "task": {"_name": "masked_lm"}}
    ckpt = save_checkpoint(tmp_path / "ckpt.pt", state, cfg=cfg)
    out = tmp_path / "hf"
    convert_fairseq_checkpoint(ckpt, out, dictionary_path=write_dictionary(tmp_path / "dict.txt"))
    assert "fairseq_conversion.py" not in {p.name for p in out.iterdir()}
    tokenizer = AutoTokenizer.from_pretrained(out)
    assert tokenizer.mask_token_id == 24 and tokenizer("w0 w3")["input_ids"] == [0, 4, 7, 2]
    expected = reference_mlm_logits(state, IDS)
    for trust in (False, True):
        model = AutoModelForMaskedLM.from_pretrained(out, trust_remote_code=trust).eval()
        assert not model.config.causal
        assert torch.equal(model.lm_head.decoder.bias, state["encoder.lm_head.bias"])
        with torch.no_grad():
            torch.testing.assert_close(model(IDS).logits, expected, atol=1e-5, rtol=1e-5)


REMOTE_SCRIPT = """
    ids = torch.load({ids!r})
    out = {{}}
    for name, folder in (("AutoModelForCausalLM", {lm!r}), ("AutoModelForMaskedLM", {blm!r})):
        model = load_remote(name, folder)
        with torch.no_grad():
            out[name] = model(input_ids=ids, use_cache=False).logits
    torch.save(out, {result!r})
"""


@pytest.mark.slow
def test_converted_folders_load_as_remote_code_without_the_package(tmp_path):
    lm, blm = lm_state(), blm_state()
    convert_fairseq_checkpoint(save_checkpoint(tmp_path / "lm.pt", lm, args=lm_args()), tmp_path / "lm")
    convert_fairseq_checkpoint(save_checkpoint(tmp_path / "blm.pt", blm, args=argparse.Namespace(
        **blm_args(**PRE_NORM_BLM))), tmp_path / "blm")
    torch.save(IDS, tmp_path / "ids.pt")
    run_with_package_blocked(REMOTE_SCRIPT.format(ids=str(tmp_path / "ids.pt"), lm=str(tmp_path / "lm"),
                                                  blm=str(tmp_path / "blm"), result=str(tmp_path / "out.pt")), tmp_path)
    out = torch.load(tmp_path / "out.pt")
    torch.testing.assert_close(out["AutoModelForCausalLM"], reference_lm_logits(lm, IDS), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out["AutoModelForMaskedLM"], reference_mlm_logits(blm, IDS), atol=1e-5, rtol=1e-5)


def test_dictionary_tokenizer_maps_fairseq_symbols_to_ids(tmp_path):
    ckpt = save_checkpoint(tmp_path / "ckpt.pt", lm_state(), args=lm_args())
    convert_fairseq_checkpoint(ckpt, tmp_path / "hf", dictionary_path=write_dictionary(tmp_path / "dict.txt"))
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "hf")
    assert [tokenizer.convert_ids_to_tokens(i) for i in range(4)] == ["<s>", "<pad>", "</s>", "<unk>"]
    assert (tokenizer.bos_token_id, tokenizer.pad_token_id, tokenizer.eos_token_id, tokenizer.unk_token_id) == (
        0, 1, 2, 3)
    assert tokenizer("w0 w19  never-seen")["input_ids"] == [4, 23, 3]  # causal LM: nothing added
    assert tokenizer.decode([4, 23, 2]) == "w0 w19 </s>"
    assert len(tokenizer) == 24


def test_the_paper_lm_sizes_give_our_parameter_count():
    args = vars(lm_args(decoder_embed_dim=512, decoder_input_dim=512, decoder_output_dim=512, decoder_layers=7,
                        expand_ratio=3, rpe_embedding=64, rpe_layers=6, glu_dim=512))
    shapes = {k: v.shape for k, v in reference_state(LM, d=512, layers=7, width=1536, rpe=64, rpe_layers=6, glu=512,
                                                     vocab=50264).items()}
    # the reference's trainable tensors: all but the fixed decay and the version buffer (plus the final LayerNorm)
    reference = sum(math.prod(s) for k, s in shapes.items() if not k.endswith(("gamma", "version"))) + 2 * 512
    gammas = {k: torch.full(s, 0.99) for k, s in shapes.items() if k.endswith("gamma")}
    config = build_config(args, "causal_lm", {LM + "embed_tokens.weight": torch.empty(50264, 512, device="meta"),
                                              **gammas})
    with torch.device("meta"):
        model = TnnForCausalLM(config)
    ours = sum(p.numel() for p in model.parameters() if p.requires_grad)
    assert ours == reference == 48_666_624


# -- refusals ----------------------------------------------------------------------------------------------------


def test_published_post_norm_blm_converts_and_matches_the_reference_forward(tmp_path):
    """roberta_tnn_v2_decay_99 (RoBERTa's base_architecture: post-norm, layernorm_embedding, no_scale_embedding, no
    final LayerNorm) converts into the same model: the config options, the embedding LayerNorm's tensors, and the
    logits of a forward written from the reference's definitions."""
    state = blm_state(final_norm=False, layernorm_embedding=True)
    ckpt = save_checkpoint(tmp_path / "ckpt.pt", state, args=argparse.Namespace(**blm_args()))
    out = tmp_path / "hf"
    result = convert_fairseq_checkpoint(ckpt, out, dictionary_path=write_dictionary(tmp_path / "dict.txt"))
    config = result.config
    assert (config.norm_placement, config.embedding_layer_norm, config.scale_embeddings, config.final_norm,
            config.classifier_pooling) == ("post", True, False, "none", "mean")
    assert any("classifier_pooling='mean'" in note for note in result.notes)
    saved = json.loads((out / "config.json").read_text())
    assert (saved["norm_placement"], saved["embedding_layer_norm"], saved["scale_embeddings"],
            saved["final_norm"]) == ("post", True, False, "none")
    block = dict(pre_norm=False, scale=False, embed_norm=True, final_norm=False)
    expected = reference_mlm_logits(state, IDS, **block)
    # leaving out the post-norm or the embedding LayerNorm changes the logits, so the comparison below sees both (the
    # scale does not matter in front of a LayerNorm, which is scale-invariant; test_paper_architectures tests it)
    for wrong in (dict(block, pre_norm=True), dict(block, embed_norm=False)):
        assert not torch.allclose(reference_mlm_logits(state, IDS, **wrong), expected, atol=1e-3)
    for trust in (False, True):
        model = AutoModelForMaskedLM.from_pretrained(out, trust_remote_code=trust).eval()
        assert torch.equal(model.model.embedding_norm.weight, state[BLM + "layernorm_embedding.weight"])
        assert torch.equal(model.model.embedding_norm.bias, state[BLM + "layernorm_embedding.bias"])
        assert not any(name.startswith("model.final_norm.") for name in model.state_dict())
        with torch.no_grad():
            torch.testing.assert_close(model(IDS).logits, expected, atol=1e-5, rtol=1e-5)


def test_post_norm_lm_without_final_norm_converts(tmp_path):
    """The decoder follows the same rules: post-norm, an embedding LayerNorm and unscaled embeddings, and no final
    LayerNorm (fairseq builds none for a post-norm decoder)."""
    state = lm_state()
    del state[LM + "layer_norm.weight"], state[LM + "layer_norm.bias"]
    d = state[LM + "embed_tokens.weight"].shape[1]
    state[LM + "layernorm_embedding.weight"] = 1 + 0.1 * torch.randn(d)
    state[LM + "layernorm_embedding.bias"] = 0.1 * torch.randn(d)
    args = lm_args(decoder_normalize_before=False, layernorm_embedding=True, no_scale_embedding=True)
    result = convert_fairseq_checkpoint(save_checkpoint(tmp_path / "ckpt.pt", state, args=args), tmp_path / "hf")
    assert (result.config.norm_placement, result.config.final_norm, result.config.scale_embeddings) == (
        "post", "none", False)
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "hf").eval()
    expected = reference_lm_logits(state, IDS, pre_norm=False, scale=False, embed_norm=True, final_norm=False)
    with torch.no_grad():
        torch.testing.assert_close(model(IDS, use_cache=False).logits, expected, atol=1e-5, rtol=1e-5)


def test_no_decoder_final_norm_drops_the_final_layer_norm(tmp_path):
    state = lm_state()
    del state[LM + "layer_norm.weight"], state[LM + "layer_norm.bias"]
    ckpt = save_checkpoint(tmp_path / "ckpt.pt", state, args=lm_args(no_decoder_final_norm=True))
    result = convert_fairseq_checkpoint(ckpt, tmp_path / "hf")
    assert (result.config.norm_placement, result.config.final_norm) == ("pre", "none")
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "hf").eval()
    with torch.no_grad():
        torch.testing.assert_close(model(IDS, use_cache=False).logits,
                                   reference_lm_logits(state, IDS, final_norm=False), atol=1e-5, rtol=1e-5)


def test_the_block_options_must_match_the_tensors(tmp_path):
    # arguments with an embedding LayerNorm whose tensors are absent; a post-norm encoder with a final LayerNorm
    ckpt = save_checkpoint(tmp_path / "a.pt", blm_state(final_norm=False), args=argparse.Namespace(**blm_args()))
    with pytest.raises(ValueError, match=r"missing key\(s\).*encoder\.sentence_encoder\.layernorm_embedding\.weight"):
        convert_fairseq_checkpoint(ckpt, tmp_path / "a")
    ckpt = save_checkpoint(tmp_path / "b.pt", blm_state(final_norm=True, layernorm_embedding=True),
                           args=argparse.Namespace(**blm_args()))
    with pytest.raises(ValueError, match=r"unknown key\(s\).*encoder\.sentence_encoder\.layer_norm\.weight"):
        convert_fairseq_checkpoint(ckpt, tmp_path / "b")
    args = blm_args()
    del args["encoder_normalize_before"]
    ckpt = save_checkpoint(tmp_path / "c.pt", blm_state(final_norm=False, layernorm_embedding=True),
                           args=argparse.Namespace(**args))
    with pytest.raises(ValueError, match="encoder_normalize_before is missing.*pre- or post-norm"):
        convert_fairseq_checkpoint(ckpt, tmp_path / "c")


def test_an_old_post_norm_checkpoint_has_no_final_norm_to_lose(tmp_path):
    # fairseq drops the final LayerNorm of a version-1 encoder: refused where the arguments describe one, accepted
    # for a post-norm encoder, which has none
    pre = blm_state()
    pre[BLM + "version"] = torch.tensor([1.0])
    ckpt = save_checkpoint(tmp_path / "pre.pt", pre, args=argparse.Namespace(**blm_args(**PRE_NORM_BLM)))
    with pytest.raises(ValueError, match="version is 1.*final_norm='layernorm'"):
        convert_fairseq_checkpoint(ckpt, tmp_path / "pre")
    post = blm_state(final_norm=False, layernorm_embedding=True)
    post[BLM + "version"] = torch.tensor([1.0])
    ckpt = save_checkpoint(tmp_path / "post.pt", post, args=argparse.Namespace(**blm_args()))
    assert convert_fairseq_checkpoint(ckpt, tmp_path / "post").config.final_norm == "none"


def test_unknown_and_missing_keys_are_refused_by_name(tmp_path):
    state = lm_state()
    state[LM + "layers.0.self_attn.gtu.toep.extra.weight"] = torch.zeros(3)
    del state[LM + "layers.1.glu.l2.bias"]
    ckpt = save_checkpoint(tmp_path / "ckpt.pt", state, args=lm_args())
    with pytest.raises(ValueError) as err:
        convert_fairseq_checkpoint(ckpt, tmp_path / "hf")
    message = str(err.value)
    assert "unknown key(s)" in message and "'decoder.layers.0.self_attn.gtu.toep.extra.weight'" in message
    assert "missing key(s)" in message and "'decoder.layers.1.glu.l2.bias'" in message


def test_a_missing_layer_is_refused(tmp_path):
    ckpt = save_checkpoint(tmp_path / "ckpt.pt", lm_state(), args=lm_args(decoder_layers=3))
    with pytest.raises(ValueError, match=r"missing key\(s\).*decoder\.layers\.2\.self_attn\.gtu\.u_proj\.weight"):
        convert_fairseq_checkpoint(ckpt, tmp_path / "hf")


def test_mismatched_shape_is_refused_naming_key_and_shapes(tmp_path):
    state = lm_state()
    state[LM + "layers.1.self_attn.gtu.toep.rpe.out.2.weight"] = torch.zeros(32, 9)
    ckpt = save_checkpoint(tmp_path / "ckpt.pt", state, args=lm_args())
    with pytest.raises(ValueError) as err:
        convert_fairseq_checkpoint(ckpt, tmp_path / "hf")
    assert ("decoder.layers.1.self_attn.gtu.toep.rpe.out.2.weight has shape (32, 9), our "
            "model.layers.1.gtu.token_mixer.rpe.out_proj.weight needs (32, 8)") in str(err.value)


def test_decay_values_must_be_the_configured_gamma(tmp_path):
    state = lm_state()
    state[LM + "layers.1.self_attn.gtu.toep.gamma"].fill_(0.9)
    ckpt = save_checkpoint(tmp_path / "ckpt.pt", state, args=lm_args())
    with pytest.raises(ValueError, match=r"decoder\.layers\.1\.self_attn\.gtu\.toep\.gamma holds 0\.899.*0\.99"):
        convert_fairseq_checkpoint(ckpt, tmp_path / "hf")


def test_a_half_precision_checkpoint_keeps_the_gamma_it_trained_with(tmp_path):
    state = {k: v.half() for k, v in lm_state().items()}
    ckpt = save_checkpoint(tmp_path / "ckpt.pt", state, args=lm_args())
    result = convert_fairseq_checkpoint(ckpt, tmp_path / "hf")
    assert result.config.decay_gamma == torch.tensor(0.99, dtype=torch.float16).item() == 0.990234375
    assert any("rounded to their precision" in note for note in result.notes)
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "hf")
    assert model.dtype == torch.float32
    assert torch.equal(model.model.embeddings.weight, state[LM + "embed_tokens.weight"].float())


def test_a_checkpoint_needing_more_than_namespace_needs_trust(tmp_path):
    ckpt = save_checkpoint(tmp_path / "ckpt.pt", lm_state(), args=lm_args(), best=np.float64(3.5))
    with pytest.raises(ValueError, match=r"numpy.*--trust_checkpoint"):
        convert_fairseq_checkpoint(ckpt, tmp_path / "hf")
    convert_fairseq_checkpoint(ckpt, tmp_path / "hf", trust_checkpoint=True)
    assert (tmp_path / "hf" / "model.safetensors").is_file()


def test_command_line_entry_point(tmp_path, capsys):
    main = script_main("convert_fairseq_checkpoint")
    ckpt = save_checkpoint(tmp_path / "ckpt.pt", lm_state(), args=lm_args())
    main(["--checkpoint_path", str(ckpt), "--pytorch_dump_folder_path", str(tmp_path / "hf")])
    assert "Converted" in capsys.readouterr().out
    with pytest.raises(SystemExit) as exit_info:  # the folder is now in use
        main(["--checkpoint_path", str(ckpt), "--pytorch_dump_folder_path", str(tmp_path / "hf")])
    assert exit_info.value.code == 2
    assert "convert_fairseq_checkpoint.py: error:" in capsys.readouterr().err
