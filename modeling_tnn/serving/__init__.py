"""Serving causal TNNs with vLLM (docs/serving.md): the plugin that vLLM loads through its ``vllm.general_plugins``
entry point (:mod:`~modeling_tnn.serving.vllm_registration`), the model it builds
(:mod:`~modeling_tnn.serving.vllm_model`), and the vLLM-free pieces they use (which folders can be served, the
per-request state slots).

Like :mod:`modeling_tnn.recipes`, nothing in the model code imports this package: a saved folder's remote code is the
same with or without it. The modules that import vLLM run only in vLLM's own environment (``make vllm-install``).
"""
