"""Toeplitz Neural Networks (TNN, FD-TNN, SKI-TNN, ETSC generation) for Hugging Face Transformers.

Importing the package registers model_type ``"tnn"`` with ``AutoConfig``, ``AutoModel``,
``AutoModelForCausalLM``, ``AutoModelForMaskedLM``, ``AutoModelForSequenceClassification``,
``AutoModelForTokenClassification`` and ``AutoModelForQuestionAnswering``.
"""

from transformers import (
    AutoConfig,
    AutoModel,
    AutoModelForCausalLM,
    AutoModelForMaskedLM,
    AutoModelForQuestionAnswering,
    AutoModelForSequenceClassification,
    AutoModelForTokenClassification,
)

from .configuration_tnn import TnnConfig
from .modeling_tnn import (
    TnnForCausalLM,
    TnnForMaskedLM,
    TnnForQuestionAnswering,
    TnnForSequenceClassification,
    TnnForTokenClassification,
    TnnModel,
    TnnPreTrainedModel,
)
from .preset_loading import list_presets, load_preset

AutoConfig.register("tnn", TnnConfig, exist_ok=True)
AutoModel.register(TnnConfig, TnnModel, exist_ok=True)
AutoModelForCausalLM.register(TnnConfig, TnnForCausalLM, exist_ok=True)
AutoModelForMaskedLM.register(TnnConfig, TnnForMaskedLM, exist_ok=True)
AutoModelForSequenceClassification.register(TnnConfig, TnnForSequenceClassification, exist_ok=True)
AutoModelForTokenClassification.register(TnnConfig, TnnForTokenClassification, exist_ok=True)
AutoModelForQuestionAnswering.register(TnnConfig, TnnForQuestionAnswering, exist_ok=True)

__all__ = [
    "TnnConfig",
    "TnnModel",
    "TnnPreTrainedModel",
    "TnnForCausalLM",
    "TnnForMaskedLM",
    "TnnForSequenceClassification",
    "TnnForTokenClassification",
    "TnnForQuestionAnswering",
    "list_presets",
    "load_preset",
]
