"""Toeplitz Neural Networks (TNN, FD-TNN, SKI-TNN, ETSC generation) for Hugging Face Transformers.

Importing the package registers model_type ``"tnn"`` with ``AutoConfig``, ``AutoModel``,
``AutoModelForCausalLM``, ``AutoModelForMaskedLM`` and ``AutoModelForSequenceClassification``.
"""

from transformers import (
    AutoConfig,
    AutoModel,
    AutoModelForCausalLM,
    AutoModelForMaskedLM,
    AutoModelForSequenceClassification,
)

from .configuration_tnn import TnnConfig
from .modeling_tnn import (
    TnnForCausalLM,
    TnnForMaskedLM,
    TnnForSequenceClassification,
    TnnModel,
    TnnPreTrainedModel,
)
from .presets import list_presets, load_preset

AutoConfig.register("tnn", TnnConfig, exist_ok=True)
AutoModel.register(TnnConfig, TnnModel, exist_ok=True)
AutoModelForCausalLM.register(TnnConfig, TnnForCausalLM, exist_ok=True)
AutoModelForMaskedLM.register(TnnConfig, TnnForMaskedLM, exist_ok=True)
AutoModelForSequenceClassification.register(TnnConfig, TnnForSequenceClassification, exist_ok=True)

__all__ = [
    "TnnConfig",
    "TnnModel",
    "TnnPreTrainedModel",
    "TnnForCausalLM",
    "TnnForMaskedLM",
    "TnnForSequenceClassification",
    "list_presets",
    "load_preset",
]
