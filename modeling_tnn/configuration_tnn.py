"""Configuration of Toeplitz Neural Networks (TNN, FD-TNN, SKI-TNN)."""

from __future__ import annotations

import contextlib
import contextvars
import copy
import math
from collections.abc import Iterator
from typing import Any

from transformers import PretrainedConfig

TOKEN_MIXERS = ("dense", "fd", "ski")
GENERATION_CACHE_MODES = ("auto", "compact", "etsc", "exact")
# The papers' architecture choices (the defaults are the first value of each: this project's original block).
NORM_PLACEMENTS = ("pre", "post")
FINAL_NORMS = ("layernorm", "simplermsnorm", "none")
CLASSIFIER_POOLINGS = ("auto", "mean", "last")
# The fields validate_fields checks: assigning one of them re-validates the config (see TnnConfig.__setattr__).
VALIDATED_FIELDS = frozenset({
    "vocab_size", "hidden_size", "num_hidden_layers", "gtu_expand_ratio", "glu_expand_ratio", "rpe_dim",
    "rpe_layers", "decay_gamma", "token_mixer", "causal", "ski_rank", "ski_kernel_size", "fd_kernel_length",
    "etsc_length", "generation_cache", "dropout", "initializer_range", "norm_placement", "embedding_layer_norm",
    "scale_embeddings", "final_norm", "classifier_pooling", "fft_recompute", "compact_tolerance",
})
# Set while a batch of assignments is applied (from_dict's kwargs, update): the batch is validated as a whole once
# it is complete, so that an order such as token_mixer="ski" before causal=False is not refused half-way.
_VALIDATION_DEFERRED: contextvars.ContextVar[bool] = contextvars.ContextVar("tnn_validation_deferred", default=False)


@contextlib.contextmanager
def _validation_deferred() -> Iterator[None]:
    token = _VALIDATION_DEFERRED.set(True)
    try:
        yield
    finally:
        _VALIDATION_DEFERRED.reset(token)


def _is_number(value: Any) -> bool:
    """A finite real number (``bool`` excluded: ``dropout=True`` is a mistake, not 1)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


class TnnConfig(PretrainedConfig):
    r"""Configuration of a Toeplitz Neural Network.

    The defaults are the paper's WikiText-103 language model (7 layers, width 512, GTU expansion 3, GLU
    expansion 1, a 6-layer RPE of width 64, decay 0.99).

    Args:
        vocab_size: Number of rows of the token embedding.
        hidden_size: Model width ``d``.
        num_hidden_layers: Number of TNN blocks.
        gtu_expand_ratio: Width of the Gated Toeplitz Unit as a multiple of ``hidden_size``; this is the number
            of channels the token mixer mixes.
        glu_expand_ratio: Width of the GLU channel mixer as a multiple of ``hidden_size``.
        rpe_dim: Width of the relative-position encoder (RPE) MLP.
        rpe_layers: Number of hidden ``[SimpleRMSNorm, ReLU, Linear]`` stages of the RPE.
        decay_gamma: Exponential decay ``gamma`` in (0, 1]; the dense kernel is ``RPE(k) * gamma**|k|``.
        token_mixer: ``"dense"`` (TNN, FFT Toeplitz product), ``"fd"`` (RPE in the frequency domain) or
            ``"ski"`` (band convolution + structured kernel interpolation; bidirectional only).
        causal: ``None`` lets the model class decide (causal for ``TnnModel``/``TnnForCausalLM``, bidirectional for
            masked LM and sequence classification); the resolved value is what gets saved.
        ski_rank: Number of SKI inducing points (at least 2).
        ski_kernel_size: Odd width of SKI's centred band convolution.
        fd_kernel_length: FD samples its RPE on the rfft grid of FFT size ``2 * fd_kernel_length``, so its kernel
            has a fixed support of ``fd_kernel_length`` lags whatever the input length (the receptive field).
        etsc_length: Length ``L`` of the ETSC Toeplitz-to-SSM conversion of a kernel that does not decay (its SSM
            is exact for contexts of at most ``L`` tokens); the SSM of a decaying dense kernel spans at least its
            float32 support (about 1,650 lags for ``decay_gamma=0.99`` at initialisation) and is exact at every length.
        generation_cache: How ``generate`` decodes. ``"auto"`` (default): a window of past mixer inputs over the
            kernel's float32 support wherever it has one (FD's finite support; dense with ``decay_gamma < 1``, whose
            tail falls below float32 resolution after a computable number of lags): exact at every length in constant
            memory; ETSC otherwise (dense with ``decay_gamma == 1``, which warns once past ``etsc_length``).
            ``"etsc"``: the diagonal SSM of the ETSC conversion. ``"exact"``: the window (the whole history for dense
            with ``decay_gamma == 1``: O(t) per token). ``"compact"``: a decaying dense kernel's first lags as a
            short window and its tail as a few complex modes per channel (a state of about a tenth of the window's),
            with a certified error bound; ``"auto"`` takes it for every layer whose bound meets
            ``compact_tolerance``.
        compact_tolerance: The certified relative l1 error of a layer's kernel (its largest channel's) up to which
            ``generation_cache="auto"`` decodes that layer with the compact state; default 1e-5 (the logits then stay
            within about 1e-5 relative of the no-cache forward). In (0, 1).
        dropout: Dropout on the embeddings and on each residual branch.
        initializer_range: Standard deviation of the classification heads' initialisation.
        norm_placement: Where each block's two SimpleRMSNorms sit. ``"pre"`` (default): ``x = x + f(norm(x))``, the
            paper's causal LM. ``"post"``: ``x = norm(x + f(x))``, a SimpleRMSNorm after each residual add, the
            paper's RoBERTa-style BLM (``roberta_tnn_v2_decay_99``), which also has ``final_norm="none"``.
        embedding_layer_norm: A LayerNorm (with weight and bias) on the token embeddings, after the scale and before
            the dropout (the BLM's ``layernorm_embedding``). Default False.
        scale_embeddings: Multiply the token embeddings by ``sqrt(hidden_size)`` (default True, the paper's LM);
            False for the BLM and the LRA models, which feed them unscaled.
        final_norm: The norm after the last block: ``"layernorm"`` (default; a LayerNorm with weight and bias),
            ``"simplermsnorm"`` (parameter-free, the LRA models) or ``"none"`` (the post-norm BLM).
        classifier_pooling: How :class:`TnnForSequenceClassification` pools the sequence. ``"auto"`` (default):
            the last real token for a causal model, the mean over the real (non-padded) tokens for a bidirectional
            one. ``"mean"``: the mean over the real tokens whatever the direction (the BLM's and the LRA models'
            pooling). ``"last"``: the last real token whatever the direction.
        fft_recompute: What the mixers' FFT convolution keeps for backward in training. ``None`` (default): decide
            by size (recompute the spectra once they would exceed 64 MB a layer). ``True``: keep only the real
            inputs and recompute the spectra (and the dense kernel) in backward, least memory, two FFTs more per
            channel chunk. ``False``: keep the forward's spectra. Outputs and gradients are the same either way.
    """

    model_type = "tnn"
    _auto_class = "AutoConfig"  # save_pretrained copies this file beside config.json (remote code)
    keys_to_ignore_at_inference = ["past_key_values", "cache"]

    def __init__(
        self,
        vocab_size: int = 50264,
        hidden_size: int = 512,
        num_hidden_layers: int = 7,
        gtu_expand_ratio: float = 3,
        glu_expand_ratio: float = 1,
        rpe_dim: int = 64,
        rpe_layers: int = 6,
        decay_gamma: float = 0.99,
        token_mixer: str = "dense",
        causal: bool | None = None,
        ski_rank: int = 32,
        ski_kernel_size: int = 17,
        fd_kernel_length: int = 512,
        etsc_length: int = 512,
        generation_cache: str = "auto",
        dropout: float = 0.1,
        initializer_range: float = 0.02,
        norm_placement: str = "pre",
        embedding_layer_norm: bool = False,
        scale_embeddings: bool = True,
        final_norm: str = "layernorm",
        classifier_pooling: str = "auto",
        fft_recompute: bool | None = None,
        compact_tolerance: float = 1e-5,
        pad_token_id: int | None = None,
        bos_token_id: int | None = None,
        eos_token_id: int | None = None,
        tie_word_embeddings: bool = True,
        use_cache: bool = True,
        **kwargs,
    ):
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.num_hidden_layers = num_hidden_layers
        self.gtu_expand_ratio = gtu_expand_ratio
        self.glu_expand_ratio = glu_expand_ratio
        self.rpe_dim = rpe_dim
        self.rpe_layers = rpe_layers
        self.decay_gamma = decay_gamma
        self.token_mixer = token_mixer
        self.causal = causal
        self.ski_rank = ski_rank
        self.ski_kernel_size = ski_kernel_size
        self.fd_kernel_length = fd_kernel_length
        self.etsc_length = etsc_length
        self.generation_cache = generation_cache
        self.dropout = dropout
        self.initializer_range = initializer_range
        self.norm_placement = norm_placement
        self.embedding_layer_norm = embedding_layer_norm
        self.scale_embeddings = scale_embeddings
        self.final_norm = final_norm
        self.classifier_pooling = classifier_pooling
        self.fft_recompute = fft_recompute
        self.compact_tolerance = compact_tolerance
        self.pad_token_id = pad_token_id
        self.bos_token_id = bos_token_id
        self.eos_token_id = eos_token_id
        self.tie_word_embeddings = tie_word_embeddings
        self.use_cache = use_cache
        self.validate_fields()  # before the base class, whose own checks would raise a less helpful error
        super().__init__(**kwargs)

    # -- validation on every path that changes a field --------------------------------------------------------------
    # transformers applies extra ``from_pretrained``/``from_dict`` kwargs with setattr AFTER __init__, and
    # ``update``/``update_from_string`` and plain assignment skip __init__ altogether: each of them validates too.
    def __setattr__(self, key: str, value: Any) -> None:
        if key not in VALIDATED_FIELDS or _VALIDATION_DEFERRED.get() or not self._fields_complete():
            super().__setattr__(key, value)
            return
        with self._validated_batch():
            super().__setattr__(key, value)

    def _fields_complete(self) -> bool:
        # False while __init__ assigns the fields one by one (it validates them all once they are set).
        fields = self.__dict__
        return all(name in fields for name in VALIDATED_FIELDS)

    @contextlib.contextmanager
    def _validated_batch(self) -> Iterator[None]:
        """Apply the assignments of the block, then validate them as a whole; all or nothing: on a ``ValueError``
        (from the block or from validation) every attribute is put back as it was."""
        before = dict(self.__dict__)
        try:
            with _validation_deferred():
                yield
            self.validate_fields()
        except ValueError:
            self.__dict__.clear()
            self.__dict__.update(before)
            raise

    @classmethod
    def from_dict(cls, config_dict: dict[str, Any], **kwargs: Any) -> "TnnConfig" | tuple["TnnConfig", dict]:
        """:meth:`PretrainedConfig.from_dict`, validating the config once the extra ``kwargs`` are applied (this is
        the path of ``from_pretrained(folder, decay_gamma=...)`` and ``AutoConfig.from_pretrained``)."""
        with _validation_deferred():
            result = super().from_dict(config_dict, **kwargs)
        (result[0] if isinstance(result, tuple) else result).validate_fields()
        return result

    def update(self, config_dict: dict[str, Any]) -> None:
        """Set the attributes in ``config_dict``; all or nothing: a bad value raises and leaves the config as it was."""
        with self._validated_batch():
            super().update(config_dict)

    def update_from_string(self, update_str: str) -> None:
        """:meth:`PretrainedConfig.update_from_string` (``"k=v,k2=v2"``), validated like :meth:`update` (a malformed
        string or an unknown key also leaves the config as it was)."""
        with self._validated_batch():
            super().update_from_string(update_str)

    # -- validation -------------------------------------------------------------------------------------------
    def validate_fields(self) -> None:
        """Raise ``ValueError`` naming the first field whose value is not allowed."""
        for name in ("vocab_size", "hidden_size", "num_hidden_layers", "rpe_dim", "ski_rank", "ski_kernel_size",
                     "fd_kernel_length", "etsc_length"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"TnnConfig.{name} must be a positive integer, got {value!r}.")
        if isinstance(self.rpe_layers, bool) or not isinstance(self.rpe_layers, int) or self.rpe_layers < 0:
            raise ValueError(f"TnnConfig.rpe_layers must be a non-negative integer, got {self.rpe_layers!r}.")
        for name in ("gtu_expand_ratio", "glu_expand_ratio"):
            value = getattr(self, name)
            if not _is_number(value) or int(value * self.hidden_size) < 1:
                raise ValueError(
                    f"TnnConfig.{name} must be a positive number with {name} * hidden_size >= 1, got {value!r}."
                )
        if self.token_mixer not in TOKEN_MIXERS:
            raise ValueError(f"TnnConfig.token_mixer must be one of {TOKEN_MIXERS}, got {self.token_mixer!r}.")
        if not _is_number(self.decay_gamma) or not 0 < self.decay_gamma <= 1:
            raise ValueError(f"TnnConfig.decay_gamma must lie in (0, 1], got {self.decay_gamma!r}.")
        if self.ski_kernel_size % 2 == 0:
            raise ValueError(f"TnnConfig.ski_kernel_size must be odd (a centred band), got {self.ski_kernel_size}.")
        if self.ski_rank < 2:
            raise ValueError(f"TnnConfig.ski_rank must be at least 2 (inducing points), got {self.ski_rank}.")
        if not _is_number(self.dropout) or not 0 <= self.dropout < 1:
            raise ValueError(f"TnnConfig.dropout must lie in [0, 1), got {self.dropout!r}.")
        if not _is_number(self.initializer_range) or self.initializer_range < 0:
            raise ValueError(
                f"TnnConfig.initializer_range must be a non-negative number, got {self.initializer_range!r}."
            )
        if not (self.causal is None or isinstance(self.causal, bool)):
            raise ValueError(f"TnnConfig.causal must be None, True or False, got {self.causal!r}.")
        if self.generation_cache not in GENERATION_CACHE_MODES:
            raise ValueError(
                f"TnnConfig.generation_cache must be one of {GENERATION_CACHE_MODES}, got {self.generation_cache!r}."
            )
        for name, allowed in (("norm_placement", NORM_PLACEMENTS), ("final_norm", FINAL_NORMS),
                              ("classifier_pooling", CLASSIFIER_POOLINGS)):
            value = getattr(self, name)
            if not isinstance(value, str) or value not in allowed:
                raise ValueError(f"TnnConfig.{name} must be one of {allowed}, got {value!r}.")
        for name in ("embedding_layer_norm", "scale_embeddings"):
            value = getattr(self, name)
            if not isinstance(value, bool):
                raise ValueError(f"TnnConfig.{name} must be True or False, got {value!r}.")
        if self.fft_recompute is not None and not isinstance(self.fft_recompute, bool):
            raise ValueError(f"TnnConfig.fft_recompute must be None, True or False, got {self.fft_recompute!r}.")
        if not _is_number(self.compact_tolerance) or not 0 < self.compact_tolerance < 1:
            raise ValueError(f"TnnConfig.compact_tolerance must lie in (0, 1), got {self.compact_tolerance!r}.")
        if self.causal is True and self.token_mixer == "ski":
            raise ValueError(self._causal_ski_message())

    @staticmethod
    def _causal_ski_message() -> str:
        return (
            "TnnConfig.token_mixer='ski' is bidirectional only, but the model is causal (causal=True). SKI's "
            "per-length inducing grid can be neither causal-consistent nor turned into a recurrence (the paper drops "
            "SKI for causal models): use token_mixer='fd' or 'dense', or set causal=False."
        )

    def resolve_causal(self, default: bool, allowed: tuple[bool, ...], head: str) -> "TnnConfig":
        """Return the config a model class should hold: ``causal`` resolved to ``default`` when it is ``None``.

        Raises ``ValueError`` when an explicit ``causal`` contradicts the head (for example a masked LM with
        ``causal=True``) or when SKI is asked to be causal.
        """
        causal = default if self.causal is None else self.causal
        if causal not in allowed:
            allowed_text = " or ".join(str(v) for v in allowed)
            raise ValueError(
                f"TnnConfig.causal={causal} contradicts {head}, which needs causal={allowed_text} "
                "(or causal=None to let the class decide)."
            )
        if causal and self.token_mixer == "ski":  # checked before assigning, which would raise without the head
            raise ValueError(self._causal_ski_message() + f" (building {head})")
        if self.causal is None:
            config = copy.deepcopy(self)
            config.causal = causal
            return config
        return self

    # -- derived sizes ---------------------------------------------------------------------------------------------
    @property
    def gtu_dim(self) -> int:
        """Number of channels of the GTU, i.e. of the token mixer."""
        return int(self.gtu_expand_ratio * self.hidden_size)

    @property
    def glu_dim(self) -> int:
        return int(self.glu_expand_ratio * self.hidden_size)

    @property
    def layer_types(self) -> list[str]:
        # transformers' mask builder (5.23) treats "linear_attention" layers as recurrent, not as KV attention.
        return ["linear_attention"] * self.num_hidden_layers
