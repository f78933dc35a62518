# The test file an in-tree `tests/models/tnn/test_modeling_tnn.py` of transformers would be: transformers' own
# mixins (ModelTesterMixin, GenerationTesterMixin, PipelineTesterMixin, ConfigTester) over every TNN class.
#
# It is not collected by this project's suite directly: tests/models/test_transformers_mixins.py copies a transformers
# test tree (TRANSFORMERS_TESTS_DIR) to a temporary folder, writes this file there as tests/models/tnn/ and runs
# pytest on it in a subprocess, so the relative imports below resolve inside that tree.
#
# Every place where TNN differs from what the mixins assume is adapted below, with the reason beside it.
import contextlib
import unittest
from unittest import mock

from transformers import is_torch_available
from transformers.testing_utils import require_torch, torch_device

from ...generation.test_utils import GenerationTesterMixin
from ...test_configuration_common import ConfigTester
from ...test_modeling_common import ModelTesterMixin, ids_tensor
from ...test_pipeline_mixin import PipelineTesterMixin


if is_torch_available():
    import torch

    from modeling_tnn import (
        TnnConfig,
        TnnForCausalLM,
        TnnForMaskedLM,
        TnnForQuestionAnswering,
        TnnForSequenceClassification,
        TnnForTokenClassification,
        TnnModel,
    )

    import torch.utils._pytree as pytree
    from transformers import Cache
    from transformers.models.auto import modeling_auto

    # An in-tree model is listed in transformers' Auto name mappings, and the mixins read them to know what each
    # class is: which labels a head takes (_prepare_for_class), that TnnModel is a base model with no loss
    # (test_training), under which attribute a head keeps it (test_base_model_prefix_loads_base_weights).
    # Registering with the Auto classes (what `import modeling_tnn` does) does not list a model there, so this test
    # module lists TNN the way modeling_auto.py lists an in-tree model ("tnn" is no key of CONFIG_MAPPING_NAMES, so
    # the Auto classes themselves still resolve TNN through its registration).
    for _mapping, _class in (
        (modeling_auto.MODEL_MAPPING_NAMES, TnnModel),
        (modeling_auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES, TnnForCausalLM),
        (modeling_auto.MODEL_FOR_MASKED_LM_MAPPING_NAMES, TnnForMaskedLM),
        (modeling_auto.MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES, TnnForSequenceClassification),
        (modeling_auto.MODEL_FOR_TOKEN_CLASSIFICATION_MAPPING_NAMES, TnnForTokenClassification),
        (modeling_auto.MODEL_FOR_QUESTION_ANSWERING_MAPPING_NAMES, TnnForQuestionAnswering),
    ):
        _mapping.setdefault("tnn", _class.__name__)


class TnnModelTester:
    """Builds a tiny config and inputs, as every in-tree model's tester does."""

    def __init__(self, parent, token_mixer="dense", causal=None, batch_size=13, seq_length=7, vocab_size=99,
                 hidden_size=32, num_hidden_layers=2, num_labels=3, num_choices=4, type_sequence_label_size=2):
        self.parent = parent
        self.token_mixer = token_mixer
        self.causal = causal
        self.batch_size = batch_size
        self.seq_length = seq_length
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.num_hidden_layers = num_hidden_layers
        self.num_labels = num_labels
        self.num_choices = num_choices
        self.type_sequence_label_size = type_sequence_label_size
        self.is_training = True
        # Padding id 0: test_load_with_mismatched_shapes reloads with vocab_size=10, and the embedding's padding row
        # must lie inside the vocabulary.
        self.pad_token_id = 0
        self.bos_token_id = vocab_size - 1
        self.eos_token_id = vocab_size - 1

    def get_config(self):
        return TnnConfig(
            vocab_size=self.vocab_size,
            hidden_size=self.hidden_size,
            num_hidden_layers=self.num_hidden_layers,
            gtu_expand_ratio=1,
            glu_expand_ratio=1,
            rpe_dim=16,
            rpe_layers=1,
            token_mixer=self.token_mixer,
            causal=self.causal,
            fd_kernel_length=16,
            ski_rank=4,
            ski_kernel_size=3,
            etsc_length=16,
            # Dense decodes with the exact window of its kernel's float32 support here, not "auto"'s compact state:
            # "auto" fits each layer's modal tail at the first cached forward of a fresh model (seconds on a CPU),
            # and the mixins build hundreds of fresh models. The compact state has its own tests (tests/decoding).
            generation_cache="exact" if self.token_mixer == "dense" else "auto",
            dropout=0.1,
            num_labels=self.num_labels,
            pad_token_id=self.pad_token_id,
            bos_token_id=self.bos_token_id,
            eos_token_id=self.eos_token_id,
        )

    def get_pipeline_config(self):
        config = self.get_config()
        config.vocab_size = 300  # the pipeline tests' tokenizers have larger vocabularies
        return config

    def prepare_config_and_inputs(self):
        # Token ids from 1: a padding id inside the sequence would be read as padding by the encoder heads (they take
        # `input_ids != pad_token_id` as their mask when no attention_mask is given, and inputs_embeds has no ids).
        input_ids = ids_tensor([self.batch_size, self.seq_length], self.vocab_size - 1) + 1
        # Padded as transformers' causal LM tester pads: right padding of varied lengths (row i keeps i + 1 tokens,
        # the later rows none padded). The generation tests take the first rows, so they generate from right-padded
        # prompts (a user error transformers warns of; TNN, like Llama, generates through it), and the mixins that
        # need left padding (continuing from a cache, padding against packing) flip this mask to the left themselves.
        attention_mask = torch.tril(torch.ones_like(input_ids))
        return self.get_config(), input_ids, attention_mask

    def prepare_config_and_inputs_for_common(self):
        config, input_ids, attention_mask = self.prepare_config_and_inputs()
        return config, {"input_ids": input_ids, "attention_mask": attention_mask}

    def create_and_check_model(self, config, input_ids, attention_mask):
        model = TnnModel(config).to(torch_device).eval()
        result = model(input_ids, attention_mask=attention_mask, output_hidden_states=True)
        self.parent.assertEqual(result.last_hidden_state.shape, (self.batch_size, self.seq_length, self.hidden_size))
        self.parent.assertEqual(len(result.hidden_states), config.num_hidden_layers + 1)


class TnnModelTestBase(ModelTesterMixin, PipelineTesterMixin):
    """What the three mixers' test classes share."""

    token_mixer = "dense"
    causal = None
    # TNN has no attention: like Mamba, no attention weights to return, check or prune.
    has_attentions = False

    def setUp(self):
        self.model_tester = TnnModelTester(self, token_mixer=self.token_mixer, causal=self.causal)
        self.config_tester = ConfigTester(self, config_class=TnnConfig, hidden_size=37,
                                          common_properties=["hidden_size", "num_hidden_layers", "vocab_size"])

    # A saved TNN records the direction it runs in (config.causal), and a head of the other direction refuses it
    # (a causal backbone's weights are no bidirectional encoder's). The mixin saves the base model built from the
    # tester's config (causal=None, so a causal TnnModel) and loads it into every head, the masked LM included: it is
    # run here once per direction, with a config that states it, over the classes that run in that direction.
    def test_base_model_prefix_loads_base_weights(self):
        directions = (True, False) if self.token_mixer != "ski" else (False,)
        for causal in directions:
            classes = tuple(cls for cls in self.all_model_classes if cls._causal_default == causal
                            or causal in cls._causal_allowed and cls not in (TnnForCausalLM, TnnForMaskedLM))
            with self.subTest(causal=causal), mock.patch.object(self, "all_model_classes", classes), \
                    mock.patch.object(self.model_tester, "causal", causal):
                super().test_base_model_prefix_loads_base_weights()

    def test_config(self):
        self.config_tester.run_common_tests()

    def test_model(self):
        self.model_tester.create_and_check_model(*self.model_tester.prepare_config_and_inputs())


@require_torch
class TnnDenseModelTest(TnnModelTestBase, GenerationTesterMixin, unittest.TestCase):
    token_mixer = "dense"

    # The generation mixins know the state of two kinds of cache layers: attention keys/values and the convolution
    # plus recurrent states of transformers' linear-attention layers, checked against Mamba's config fields
    # (intermediate_size, conv_kernel, state_size). A TNN layer keeps another state (a window of past mixer inputs,
    # an SSM or a compact state, by the plan of its kernel), so its checks are written here from what any TNN cache
    # guarantees: one layer per block, the tokens seen, the batch on the first axis of every state.
    def _check_past_key_values_for_generate(self, batch_size, past_key_values, seq_length, config):
        self.assertIsInstance(past_key_values, Cache)
        self.assertEqual(len(past_key_values.layers), config.num_hidden_layers)
        if seq_length is not None:
            self.assertEqual(past_key_values.get_seq_length(), seq_length)
        for layer in past_key_values.layers:
            states = [state for state in layer.recurrent_states.values() if state is not None]
            self.assertTrue(states)
            for state in states:
                self.assertEqual(state.shape[0], batch_size)

    # TNN mixes every document of a packed row alone (docs/packed-sequences.md), which this test checks against the
    # left-padded batch (the mixin flips the tester's right padding to the left). It skips models without
    # attentions, stateful ones and those without an attention backend (its guesses at which models pack): here
    # those conditions are met for its duration.
    def test_eager_padding_matches_padding_free_with_position_ids(self):
        forward = TnnForCausalLM.forward
        self.assertIn(TnnForCausalLM, self.all_generative_model_classes)
        calls = []
        with contextlib.ExitStack() as stack:
            stack.enter_context(mock.patch.object(self, "has_attentions", True))
            for cls in self.all_generative_model_classes:
                stack.enter_context(mock.patch.object(cls, "_is_stateful", False))
                stack.enter_context(mock.patch.object(cls, "_supports_attention_backend", True))
            stack.enter_context(mock.patch.object(TnnForCausalLM, "forward", autospec=True,
                                                  side_effect=lambda *a, **kw: calls.append(kw) or forward(*a, **kw)))
            super().test_eager_padding_matches_padding_free_with_position_ids()
        # it compared the padded batch with the packed one (restarting position_ids, no padding)
        self.assertEqual([("attention_mask" in kw, "position_ids" in kw) for kw in calls], [(True, True), (False, True)])

    # Two TNN caches are equal when their flattened pytrees are: the same structure (plans, tokens seen) and the same
    # tensors (states and kernel constants). The cache registers itself as a pytree for torch.export.
    def _check_caches_are_equal(self, cache1, cache2):
        leaves1, spec1 = pytree.tree_flatten(cache1)
        leaves2, spec2 = pytree.tree_flatten(cache2)
        self.assertEqual(spec1, spec2)
        for leaf1, leaf2 in zip(leaves1, leaves2):
            torch.testing.assert_close(leaf1, leaf2)
    all_model_classes = (
        (TnnModel, TnnForCausalLM, TnnForMaskedLM, TnnForSequenceClassification, TnnForTokenClassification,
         TnnForQuestionAnswering) if is_torch_available() else ()
    )
    pipeline_model_mapping = (
        {
            "feature-extraction": TnnModel,
            "text-generation": TnnForCausalLM,
            "fill-mask": TnnForMaskedLM,
            "text-classification": TnnForSequenceClassification,
            "zero-shot": TnnForSequenceClassification,
            "token-classification": TnnForTokenClassification,
            "question-answering": TnnForQuestionAnswering,
        }
        if is_torch_available()
        else {}
    )


@require_torch
class TnnFdModelTest(TnnDenseModelTest):
    token_mixer = "fd"


@require_torch
class TnnSkiModelTest(TnnModelTestBase, unittest.TestCase):
    # SKI is bidirectional only: no causal LM and no generation (TnnConfig refuses causal SKI). The backbone is built
    # bidirectional (causal=False), so it and the four bidirectional heads all run on one config.
    token_mixer = "ski"
    causal = False
    all_model_classes = (
        (TnnModel, TnnForMaskedLM, TnnForSequenceClassification, TnnForTokenClassification, TnnForQuestionAnswering)
        if is_torch_available()
        else ()
    )
    pipeline_model_mapping = (
        {
            "feature-extraction": TnnModel,
            "fill-mask": TnnForMaskedLM,
            "text-classification": TnnForSequenceClassification,
            "token-classification": TnnForTokenClassification,
            "question-answering": TnnForQuestionAnswering,
        }
        if is_torch_available()
        else {}
    )
