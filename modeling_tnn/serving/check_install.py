"""``python -m modeling_tnn.serving.check_install``: the last step of ``make vllm-install``. Fails (exit 1, saying
what) unless vLLM of the plugin's version imports, this project's model code loads beside vLLM's transformers, and the
plugin's entry point is installed and registers the architecture."""

from __future__ import annotations

import sys
from importlib.metadata import entry_points


def main() -> int:
    import transformers
    import vllm

    from modeling_tnn import TnnConfig, TnnForCausalLM  # the model code, under vLLM's transformers
    from modeling_tnn.serving.servable import SERVED_ARCHITECTURE
    from modeling_tnn.serving.vllm_registration import VLLM_VERSION

    problems = []
    if vllm.__version__.split("+")[0] != VLLM_VERSION:
        problems.append(f"vLLM {vllm.__version__} is installed; the plugin is written for {VLLM_VERSION}")
    plugins = [point for point in entry_points(group="vllm.general_plugins") if point.value.startswith("modeling_tnn")]
    if not plugins:
        problems.append("the vllm.general_plugins entry point of modeling_tnn is not installed")
    else:
        plugins[0].load()()
        from vllm import ModelRegistry

        if SERVED_ARCHITECTURE not in ModelRegistry.get_supported_archs():
            problems.append(f"the plugin did not register {SERVED_ARCHITECTURE}")
    TnnForCausalLM(TnnConfig(vocab_size=16, hidden_size=8, num_hidden_layers=1, rpe_dim=4))
    for problem in problems:
        print(f"vllm-install: {problem}", file=sys.stderr)
    if not problems:
        print(f"vLLM {vllm.__version__} with transformers {transformers.__version__}: modeling_tnn's plugin registers "
              f"{SERVED_ARCHITECTURE}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
