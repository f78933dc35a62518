"""Configuration of Toeplitz Neural Networks (TNN, FD-TNN, SKI-TNN)."""

# No `from __future__ import annotations`: @strict type-checks the fields from their annotations, and skips string ones.
import contextlib
import copy
import contextvars
import functools
import math
import types
from collections.abc import Callable, Iterator
from typing import Any, Literal, Union, get_args, get_origin

from huggingface_hub.dataclasses import strict, validated_field
from huggingface_hub.errors import StrictDataclassClassValidationError, StrictDataclassFieldValidationError
from transformers import PreTrainedConfig

# The choices of the string fields: their annotations, so @strict refuses any other value.
TokenMixerName = Literal["dense", "fd", "ski"]
GenerationCacheMode = Literal["auto", "compact", "etsc", "exact"]
NormPlacement = Literal["pre", "post"]
FinalNorm = Literal["layernorm", "simplermsnorm", "none"]
ClassifierPooling = Literal["auto", "mean", "last"]
GENERATION_CACHE_MODES: tuple[str, ...] = get_args(GenerationCacheMode)

# Set while a batch of assignments is applied (update, update_from_string): the checks that relate fields run once the
# batch is complete, so that an order such as token_mixer="ski" before causal=False is not refused half-way.
_BATCH_OPEN: contextvars.ContextVar[bool] = contextvars.ContextVar("tnn_config_batch_open", default=False)


def _field(default: Any, requirement: str, holds: Callable[[Any], bool]) -> Any:
    """A field whose value, once @strict has checked its type, must satisfy ``holds``; a refusal reads ``must
    {requirement}, got {value}`` (the config puts the field's name in front)."""

    def check(value: Any) -> None:
        if not holds(value):
            raise ValueError(f"must {requirement}, got {value!r}.")

    return validated_field(check, default=default)


def _positive_integer(default: int) -> int:
    return _field(default, "be a positive integer", lambda value: value > 0)


def _positive_number(default: float) -> float:
    return _field(default, "be a positive finite number", lambda value: 0 < value < math.inf)


def _expected(annotation: Any) -> str:
    """What a type annotation allows, as a refusal says it: ``one of ('pre', 'post')``, ``a bool or None``."""
    origin = get_origin(annotation)
    if origin is Literal:
        return f"one of {get_args(annotation)}"
    if origin in (Union, types.UnionType):
        return " or ".join(dict.fromkeys(_expected(arg) for arg in get_args(annotation)))
    if annotation is type(None):
        return "None"
    name = getattr(origin or annotation, "__name__", str(annotation))
    return f"{'an' if name[0] in 'aeiou' else 'a'} {name}"


def _raising_value_errors(cls: type) -> type:
    """Turn @strict's refusals into ``ValueError`` with the wording ``TnnConfig.<field> must ..., got <value>``.

    huggingface_hub raises ``StrictDataclassError``, which is not a ``ValueError`` (what callers catch, and what every
    other check of the project raises), and words a type refusal as ``Field 'x' expected ...``.
    """
    checked_setattr, checked_validate = cls.__setattr__, cls.validate

    @functools.wraps(checked_setattr)
    def __setattr__(self, name: str, value: Any) -> None:
        try:
            checked_setattr(self, name, value)
        except StrictDataclassFieldValidationError as error:
            cause = error.__cause__
            if isinstance(cause, TypeError):  # @strict's check of the annotation
                cause = f"must be {_expected(cls.__dataclass_fields__[name].type)}, got {value!r}."
            raise ValueError(f"{cls.__name__}.{name} {cause}") from error

    @functools.wraps(checked_validate)
    def validate(self) -> None:
        try:
            checked_validate(self)
        except StrictDataclassClassValidationError as error:
            raise ValueError(str(error.__cause__)) from error

    cls.__setattr__, cls.validate = __setattr__, validate
    return cls


@_raising_value_errors
@strict
class TnnConfig(PreTrainedConfig):
    r"""Configuration of a Toeplitz Neural Network.

    The defaults are the paper's WikiText-103 language model (7 layers, width 512, GTU expansion 3, GLU
    expansion 1, a 6-layer RPE of width 64, decay 0.99).

    Every way of setting a field (the constructor, ``from_pretrained``/``from_dict`` and their keyword overrides,
    assignment, ``update``, ``update_from_string``) checks it, and a refused value raises ``ValueError`` naming the
    field and what it allows; ``update`` and ``update_from_string`` apply all of their values or none.

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
            masked LM and the encoder heads). The model holds a copy with the resolved value (``model.config.causal``,
            what gets saved) and leaves the caller's config as it was, so one config builds every head.
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

    # Each field is checked on its own by @strict (its annotation, then its rule); validate_* relate fields.
    vocab_size: int = _positive_integer(50264)
    hidden_size: int = _positive_integer(512)
    num_hidden_layers: int = _positive_integer(7)
    gtu_expand_ratio: int | float = _positive_number(3)
    glu_expand_ratio: int | float = _positive_number(1)
    rpe_dim: int = _positive_integer(64)
    rpe_layers: int = _field(6, "be a non-negative integer", lambda value: value >= 0)
    decay_gamma: int | float = _field(0.99, "lie in (0, 1]", lambda value: 0 < value <= 1)
    token_mixer: TokenMixerName = "dense"
    causal: bool | None = None
    ski_rank: int = _field(32, "be an integer of at least 2 (inducing points)", lambda value: value >= 2)
    ski_kernel_size: int = _field(17, "be a positive odd integer (a centred band)",
                                  lambda value: value > 0 and value % 2 == 1)
    fd_kernel_length: int = _positive_integer(512)
    etsc_length: int = _positive_integer(512)
    generation_cache: GenerationCacheMode = "auto"
    dropout: int | float = _field(0.1, "lie in [0, 1)", lambda value: 0 <= value < 1)
    initializer_range: int | float = _field(0.02, "be a non-negative finite number",
                                            lambda value: 0 <= value < math.inf)
    norm_placement: NormPlacement = "pre"
    embedding_layer_norm: bool = False
    scale_embeddings: bool = True
    final_norm: FinalNorm = "layernorm"
    classifier_pooling: ClassifierPooling = "auto"
    fft_recompute: bool | None = None
    compact_tolerance: int | float = _field(1e-5, "lie in (0, 1)", lambda value: 0 < value < 1)
    pad_token_id: int | None = None
    bos_token_id: int | None = None
    eos_token_id: int | list[int] | None = None
    tie_word_embeddings: bool = True
    use_cache: bool = True

    # -- checks that relate fields (@strict runs every validate_* method in __init__ and in validate()) -------------
    def validate_expand_ratios(self) -> None:
        """The GTU and the GLU have at least one channel (their width is ``int(ratio * hidden_size)``)."""
        for name in ("gtu_expand_ratio", "glu_expand_ratio"):
            ratio = getattr(self, name)
            if int(ratio * self.hidden_size) < 1:
                raise ValueError(f"TnnConfig.{name} must be a positive number with {name} * hidden_size >= 1, got "
                                 f"{ratio!r} (hidden_size={self.hidden_size}).")

    def validate_causal_token_mixer(self) -> None:
        """SKI is bidirectional only: the one place that refuses a causal SKI model (the model classes resolve
        ``causal`` by assigning it, which runs this check)."""
        if self.causal is True and self.token_mixer == "ski":
            raise ValueError(
                "TnnConfig.token_mixer='ski' is bidirectional only, but the model is causal (causal=True). SKI's "
                "per-length inducing grid can be neither causal-consistent nor turned into a recurrence (the paper "
                "drops SKI for causal models): use token_mixer='fd' or 'dense', or set causal=False."
            )

    # -- the paths @strict does not cover ---------------------------------------------------------------------------
    # @strict checks an assigned field alone and runs validate_* only in __init__: an assignment to one of TnnConfig's
    # fields after __init__ (and update's batch) re-runs them here, and puts the config back if they refuse.
    def __setattr__(self, name: str, value: Any) -> None:
        if name in TnnConfig.__annotations__ and getattr(self, "_post_init_done", False) and not _BATCH_OPEN.get():
            with self._all_or_nothing():
                super().__setattr__(name, value)
        else:
            super().__setattr__(name, value)

    @contextlib.contextmanager
    def _all_or_nothing(self) -> Iterator[None]:
        """Apply the block's assignments, then validate the config as a whole; on a ``ValueError`` (from the block or
        from validation) every attribute is put back as it was."""
        before = dict(self.__dict__)
        token = _BATCH_OPEN.set(True)
        try:
            try:
                yield
            finally:
                _BATCH_OPEN.reset(token)
            self.validate()
        except ValueError:
            self.__dict__.clear()
            self.__dict__.update(before)
            raise

    @classmethod
    def from_dict(cls, config_dict: dict[str, Any], **kwargs: Any) -> "TnnConfig | tuple[TnnConfig, dict[str, Any]]":
        """:meth:`PreTrainedConfig.from_dict`, with the keyword overrides that are fields (``from_pretrained(folder,
        decay_gamma=...)``) passed to the constructor with the file's values, so that they are validated with them
        (transformers would assign them one at a time after ``__init__``)."""
        # TnnConfig's own fields only: the base class's keywords (``dtype="auto"``, ``num_labels``, ...) keep the
        # handling transformers gives them (``dtype="auto"`` is not a torch dtype, so it never reaches ``__init__``).
        overrides = {key: kwargs.pop(key) for key in list(kwargs) if key in TnnConfig.__annotations__}
        return super().from_dict({**config_dict, **overrides}, **kwargs)

    def update(self, config_dict: dict[str, Any]) -> None:
        """Set the attributes in ``config_dict``; all or nothing: a bad value raises and leaves the config as it was."""
        with self._all_or_nothing():
            super().update(config_dict)

    def update_from_string(self, update_str: str) -> None:
        """:meth:`PreTrainedConfig.update_from_string` (``"k=v,k2=v2"``), validated like :meth:`update` (a malformed
        string or an unknown key also leaves the config as it was)."""
        with self._all_or_nothing():
            super().update_from_string(update_str)

    def resolved_for(self, default: bool, allowed: tuple[bool, ...], head: str) -> "TnnConfig":
        """The config a model of class ``head`` runs on: this very config when ``causal`` is set, else a copy with
        ``causal`` set to the class's ``default``. The caller's config is never changed, so one config with
        ``causal=None`` builds every head in turn, while ``model.config.causal`` (saved with the model) tells the
        direction the model runs in.

        Raises ``ValueError`` when an explicit ``causal`` contradicts the head (for example a masked LM with
        ``causal=True``) and, through the copy's validation, when the model would be causal SKI.
        """
        causal = default if self.causal is None else self.causal
        if causal not in allowed:
            allowed_text = " or ".join(str(value) for value in allowed)
            raise ValueError(
                f"TnnConfig.causal={causal} contradicts {head}, which needs causal={allowed_text} (or causal=None to "
                "let the class decide)."
            )
        if self.causal is not None:
            return self
        resolved = copy.deepcopy(self)
        resolved.causal = causal
        return resolved

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
