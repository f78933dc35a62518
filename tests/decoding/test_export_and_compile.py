"""torch.export and torch.compile give the eager outputs: the forward of every mixer, and a prefill + decode step
with the generation cache (a pytree of its state tensors)."""

from __future__ import annotations

import copy

import pytest
import torch

from modeling_tnn import TnnForCausalLM, TnnModel
from modeling_tnn.modeling_tnn import CACHE_FIELD

from tests.support import CAUSAL_MIXERS, MIXERS, tiny_config


def _model(mixer):
    causal = mixer != "ski"
    config = tiny_config(mixer, causal=causal, decay_gamma=0.9)  # a short SSM period: the prompt passes it
    return (TnnForCausalLM(config) if causal else TnnModel(config)).eval()


def _first(output):
    return output[0] if isinstance(output, tuple) else output.to_tuple()[0]


def _assert_same_states(a, b):
    assert a.get_seq_length() == b.get_seq_length()
    for x, y in zip(a.layers, b.layers):
        torch.testing.assert_close(x.recurrent_states[0], y.recurrent_states[0])


@pytest.mark.parametrize("mixer", MIXERS)
def test_export_of_the_forward_gives_the_eager_outputs(mixer):
    model = _model(mixer)
    ids = torch.randint(1, 128, (2, 12))
    with torch.no_grad():
        program = torch.export.export(model, (), {"input_ids": ids})  # a causal model returns its cache too
        torch.testing.assert_close(_first(program.module()(input_ids=ids)), _first(model(input_ids=ids)))


@pytest.mark.parametrize("measured", [False, True])
@pytest.mark.parametrize("prompt", [20, 400])  # dense: within the SSM's period (a window), then past it (the SSM)
@pytest.mark.parametrize("mixer", CAUSAL_MIXERS)
def test_export_of_a_prefill_and_a_decode_step(mixer, prompt, measured):
    """The exported prefill and decode step give the eager logits. Traced before any eager decode, a dense model
    sizes its state from gamma alone (twice its horizon: exact too, larger); after one, exactly as eager does."""
    model = _model(mixer)
    ids, token = torch.randint(1, 128, (2, prompt)), torch.randint(1, 128, (2, 1))
    with torch.no_grad():
        if measured:
            model(input_ids=ids[:, :2], use_cache=True)
        prefill = torch.export.export(model, (), {"input_ids": ids, "use_cache": True})
        exported = prefill.module()(input_ids=ids, use_cache=True)
        eager = model(input_ids=ids, use_cache=True)
        torch.testing.assert_close(exported.logits, eager.logits)
        exported_cache, eager_cache = getattr(exported, CACHE_FIELD), getattr(eager, CACHE_FIELD)
        if measured or mixer == "fd":
            _assert_same_states(exported_cache, eager_cache)

        step = torch.export.export(model, (), {"input_ids": token, CACHE_FIELD: copy.deepcopy(exported_cache)})
        exported = step.module()(input_ids=token, **{CACHE_FIELD: exported_cache})
        eager = model(input_ids=token, **{CACHE_FIELD: eager_cache})
        torch.testing.assert_close(exported.logits, eager.logits, atol=1e-5, rtol=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("mixer", MIXERS)
def test_compiled_model_gives_the_eager_outputs(mixer):
    """Dynamo + AOTAutograd (backend "aot_eager": the graph capture torch.compile does, without inductor's C++
    build, which takes minutes here) in eval mode and, for a causal model, a decode step on the returned cache."""
    torch._dynamo.reset()
    model = _model(mixer)
    compiled = torch.compile(model, backend="aot_eager")
    ids, token = torch.randint(1, 128, (2, 12)), torch.randint(1, 128, (2, 1))
    with torch.no_grad():
        out, reference = compiled(input_ids=ids), model(input_ids=ids)
        torch.testing.assert_close(_first(out), _first(reference))
        if mixer != "ski":
            step = compiled(input_ids=token, **{CACHE_FIELD: getattr(out, CACHE_FIELD)})
            eager = model(input_ids=token, **{CACHE_FIELD: getattr(reference, CACHE_FIELD)})
            torch.testing.assert_close(step.logits, eager.logits)


@pytest.mark.parametrize("mixer, mode", [("dense", "auto"), ("fd", "auto"), ("dense", "exact")])
def test_compiled_generate_gives_the_eager_greedy_tokens(mixer, mode):
    """transformers' compiled path: generate with a ``compile_config`` and a user cache that says it is compileable
    compiles the decode step with ``fullgraph=True`` (a graph break fails), and three graphs serve every step (the
    first count's, then the steps that fold and those that do not): the ring slots come from a tensor counter, not
    from the Python count, which would recompile at each phase."""
    from transformers import CompileConfig

    from modeling_tnn.decoding_cache import TnnCache

    torch._dynamo.reset()
    model = _model(mixer)
    prompt = torch.randint(1, 128, (2, 40))  # past the compact window (32 lags): the ring wraps while decoding
    greedy = dict(max_new_tokens=12, min_new_tokens=12, do_sample=False, eos_token_id=None, pad_token_id=0)
    with torch.no_grad():
        model(input_ids=prompt[:, :2], use_cache=True, generation_cache=mode)  # the eager fit a compiled step reads
        eager = model.generate(prompt, generation_cache=mode, **greedy)
        cache = TnnCache(model.config, mode=mode, model=model)  # its mixers say the state keeps its shapes
        assert cache.is_compileable
        config = CompileConfig(backend="eager", fullgraph=True, dynamic=None)
        config._compile_all_devices = True  # generate compiles on CPU only when told to
        with torch._dynamo.config.patch(recompile_limit=3):  # the first count's graph, then folding or not
            compiled = model.generate(prompt, **{CACHE_FIELD: cache}, compile_config=config, **greedy)
    assert hasattr(model, "_compiled_call"), "generate did not take its compiled path"
    assert torch.equal(compiled, eager)


def test_a_compiled_step_folds_only_when_due():
    """A compiled decode step of the compact state branches on the host's count: the graph of the steps between folds
    holds no fold (the fold's depthwise convolution is absent), the folding steps get a graph of their own, and every
    step gives the eager logits, across two fold periods."""
    torch._dynamo.reset()
    model = TnnForCausalLM(tiny_config("dense", decay_gamma=0.9)).eval()
    graphs = []

    def recording(graph, example_inputs):
        graphs.append({str(node.target) for node in graph.graph.nodes if node.op == "call_function"})
        return graph.forward
    compiled = torch.compile(model, backend=recording)
    prompt, tokens = torch.randint(1, 128, (2, 40)), torch.randint(1, 128, (2, 33))
    with torch.no_grad():
        compiled_cache = getattr(model(input_ids=prompt, generation_cache="auto"), CACHE_FIELD)
        eager_cache = copy.deepcopy(compiled_cache)
        assert compiled_cache.layers[0].state.PLAN == "compact"
        with torch._dynamo.config.patch(recompile_limit=3):  # the first count's graph, then folding or not
            for k in range(tokens.shape[1]):
                token = tokens[:, k:k + 1]
                step = compiled(input_ids=token, **{CACHE_FIELD: compiled_cache})
                eager = model(input_ids=token, **{CACHE_FIELD: eager_cache})
                torch.testing.assert_close(step.logits, eager.logits)
    folding = ["conv2d" in " ".join(targets) for targets in graphs]
    assert len(graphs) == 3 and True in folding and False in folding, folding


@pytest.mark.parametrize("mixer, gamma, mode, compileable", [
    ("dense", 0.9, "etsc", False), ("dense", 1.0, "exact", False), ("fd", 1.0, "exact", True),
    ("dense", 0.9, "auto", True), ("fd", 1.0, "etsc", False)])
def test_a_cache_whose_shapes_change_is_not_compileable(mixer, gamma, mode, compileable):
    """ETSC's SSM is a window until its period fills, then a complex state, and a history that does not decay grows:
    generate must not compile their step. Built for a model, the cache asks its mixers; without one it knows only
    from the first forward on, from the states it then holds."""
    from modeling_tnn.decoding_cache import TnnCache

    model = TnnForCausalLM(tiny_config(mixer, decay_gamma=gamma)).eval()
    assert TnnCache(model.config, mode=mode, model=model).is_compileable is compileable
    cache = TnnCache(model.config, mode=mode)
    assert not cache.is_compileable  # nothing declared, nothing planned yet
    with torch.no_grad():
        model(input_ids=torch.randint(1, 128, (1, 4)), **{CACHE_FIELD: cache})
    assert cache.is_compileable is compileable


@pytest.mark.slow
@pytest.mark.parametrize("dynamic", [False, True])
def test_transformers_exporter_exports_the_prefill_and_the_decode_step(dynamic):
    """transformers' own exporter (its torch.export tests, run with RUN_SLOW=1) splits generate into a prefill and a
    decode step and maps the cache's tensors by assigning the attributes of every object in it: nothing in the cache
    may be frozen (a frozen plan failed with FrozenInstanceError), and the exported steps give the eager logits."""
    exporters = pytest.importorskip("transformers.exporters.exporter_dynamo")
    from transformers.exporters.configs import DynamoConfig
    from transformers.exporters.utils import decompose_for_generation

    model = _model("dense")
    ids = torch.randint(1, 128, (2, 7))
    stages = decompose_for_generation(model, {"input_ids": ids, "attention_mask": torch.ones_like(ids)},
                                      multi_token_decode=dynamic)
    assert set(stages) == {"prefill", "decode"}
    for stage, inputs in stages.values():
        with torch.no_grad():
            eager = stage(**copy.deepcopy(inputs))
        program = exporters.DynamoExporter().export(stage, inputs, config=DynamoConfig(dynamic=dynamic))
        with torch.no_grad():
            exported = program.program.module()(**copy.deepcopy(inputs))
        torch.testing.assert_close(exported.logits, eager.logits, atol=1e-4, rtol=1e-4)
