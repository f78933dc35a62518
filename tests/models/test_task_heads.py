"""Token classification and extractive question answering: direction, exact padding, losses, Auto classes,
remote code with the package blocked, the token-classification pipeline and the README's QA recipe on saved folders
of heads fitted to one example."""

from __future__ import annotations

import json
import re

import pytest
import torch
import torch.nn.functional as F
from transformers import AutoModelForQuestionAnswering, AutoModelForTokenClassification, pipeline

from modeling_tnn import TnnForMaskedLM, TnnForQuestionAnswering, TnnForTokenClassification

from tests.remote_code import run_with_package_blocked
from tests.support import (MIXERS, PROJECT_ROOT, answer_span, assert_padded_rows_equal_rows_alone, extract_answer,
                           main_output, random_rows, save_with_tokenizer, tiny_config, tiny_config_for, with_mixers)

HEADS = (TnnForTokenClassification, TnnForQuestionAnswering)
LABELS = {"id2label": {0: "O", 1: "B-KW", 2: "I-KW"}, "label2id": {"O": 0, "B-KW": 1, "I-KW": 2}}
QUESTION = "What does it insert?"
CONTEXT = "The assert statement is a convenient way to insert debugging assertions into a program."
ANSWER = "debugging assertions"
KEYWORD = "assert"


def _head(cls, mixer: str, **overrides):
    return cls(tiny_config(mixer, num_labels=3, **overrides)).eval()


@pytest.mark.parametrize("cls", HEADS)
def test_bidirectional_by_default_causal_allowed_causal_ski_refused(cls):
    assert _head(cls, "dense").config.causal is False
    assert _head(cls, "fd", causal=True).config.causal is True
    with pytest.raises(ValueError, match="fd"):
        _head(cls, "ski", causal=True)


@pytest.mark.parametrize("causal, mixer", with_mixers([(False,), (True,)]))
def test_bidirectional_heads_see_both_sides_causal_ones_only_the_past(causal, mixer):
    model = _head(TnnForTokenClassification, mixer, causal=causal).double()
    ids = torch.randint(1, 128, (1, 30))
    changed = ids.clone()
    changed[:, 20:] = torch.randint(1, 128, (1, 10))
    with torch.no_grad():
        before, after = model(input_ids=ids).logits[:, :20], model(input_ids=changed).logits[:, :20]
    assert torch.allclose(before, after, atol=1e-10, rtol=0) == causal


# Right padding for bidirectional models, left padding for causal ones.
@pytest.mark.parametrize("cls", HEADS)
@pytest.mark.parametrize("side, causal, mixer", with_mixers([("right", False), ("left", True)]))
def test_padded_row_scores_equal_the_row_alone(cls, side, causal, mixer):
    model = _head(cls, mixer, causal=causal)
    ids, batch = assert_padded_rows_equal_rows_alone(model, random_rows(), side)
    with torch.no_grad():  # without a mask, the pad token id marks the padding (as for sequence classification)
        torch.testing.assert_close(main_output(model(input_ids=ids)), batch)


@pytest.mark.parametrize("mixer", MIXERS)
def test_token_classification_loss_is_cross_entropy_over_labelled_tokens(mixer):
    model = _head(TnnForTokenClassification, mixer)
    ids = torch.randint(1, 128, (2, 16))
    labels = torch.randint(0, 3, (2, 16))
    labels[0, :4] = -100  # special tokens / continuation sub-words / padding carry no label
    out = model(input_ids=ids, labels=labels)
    assert out.logits.shape == (2, 16, 3)
    torch.testing.assert_close(out.loss, F.cross_entropy(out.logits.reshape(-1, 3), labels.reshape(-1)))
    # Trainer passes num_items_in_batch for gradient accumulation: the loss becomes sum / num_items.
    summed = model(input_ids=ids, labels=labels, num_items_in_batch=torch.tensor(7)).loss
    torch.testing.assert_close(summed, F.cross_entropy(out.logits.reshape(-1, 3), labels.reshape(-1),
                                                       reduction="sum") / 7)
    out.loss.backward()
    assert model.model.embeddings.weight.grad.abs().sum() > 0
    assert isinstance(model(input_ids=ids, return_dict=False), tuple)


@pytest.mark.parametrize("mixer", MIXERS)
def test_question_answering_loss_averages_start_and_end_and_ignores_outside_positions(mixer):
    model = _head(TnnForQuestionAnswering, mixer)
    ids = torch.randint(1, 128, (3, 16))
    start, end = torch.tensor([1, 5, 40]), torch.tensor([3, 9, 40])  # the third answer lies outside the input
    out = model(input_ids=ids, start_positions=start, end_positions=end)
    assert out.start_logits.shape == out.end_logits.shape == (3, 16)
    expected = (F.cross_entropy(out.start_logits[:2], start[:2]) + F.cross_entropy(out.end_logits[:2], end[:2])) / 2
    torch.testing.assert_close(out.loss, expected)
    assert model(input_ids=ids, start_positions=start).loss is None  # both positions are needed for a loss
    out.loss.backward()
    assert model.model.embeddings.weight.grad.abs().sum() > 0
    hidden = model(input_ids=ids, output_hidden_states=True).hidden_states
    assert len(hidden) == model.config.num_hidden_layers + 1


@pytest.mark.parametrize("mixer", MIXERS)
def test_auto_classes_load_the_heads_on_a_pretrained_backbone(tmp_path, mixer):
    pretrained = TnnForMaskedLM(tiny_config(mixer)).eval()
    pretrained.save_pretrained(tmp_path)
    assert {"AutoModelForTokenClassification", "AutoModelForQuestionAnswering"} <= set(
        json.loads((tmp_path / "config.json").read_text())["auto_map"])
    ids = torch.randint(1, 128, (2, 13))
    with torch.no_grad():
        backbone = pretrained.model(input_ids=ids).last_hidden_state
        for auto, cls in ((AutoModelForTokenClassification, TnnForTokenClassification),
                          (AutoModelForQuestionAnswering, TnnForQuestionAnswering)):
            head = auto.from_pretrained(tmp_path).eval()
            assert type(head) is cls and head.config.causal is False
            torch.testing.assert_close(head.model(input_ids=ids).last_hidden_state, backbone, atol=0, rtol=0)


# ---- trained on one example, then used through the tokenizer: the labels the loss sees are what inference reads


def _fit(model, batch, steps=60):
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    model.train()
    for _ in range(steps):
        optimizer.zero_grad()
        model(**batch).loss.backward()
        optimizer.step()
    return model.eval()


def _keyword_tagger(tokenizer, mixer):
    """A token classifier fitted to tag the word ``assert`` in CONTEXT (B-KW, I-KW) and nothing else."""
    enc = tokenizer(CONTEXT, return_tensors="pt")
    begin = CONTEXT.index(KEYWORD)
    first, last = enc.char_to_token(begin), enc.char_to_token(begin + len(KEYWORD) - 1)
    labels = torch.zeros_like(enc.input_ids)
    labels[0, first] = 1
    labels[0, first + 1:last + 1] = 2
    torch.manual_seed(0)  # the same fit whichever test asks first
    model = TnnForTokenClassification(tiny_config_for(tokenizer, mixer, num_labels=3, **LABELS))
    return _fit(model, {"input_ids": enc.input_ids, "attention_mask": enc.attention_mask, "labels": labels})


def _answerer(tokenizer, mixer):
    """A question-answering model fitted to answer QUESTION on CONTEXT with ANSWER."""
    enc = tokenizer(QUESTION, CONTEXT, return_tensors="pt")
    begin = CONTEXT.index(ANSWER)
    start = enc.char_to_token(begin, sequence_index=1)
    end = enc.char_to_token(begin + len(ANSWER) - 1, sequence_index=1)
    torch.manual_seed(0)
    model = TnnForQuestionAnswering(tiny_config_for(tokenizer, mixer))
    return _fit(model, {"input_ids": enc.input_ids, "attention_mask": enc.attention_mask,
                        "start_positions": torch.tensor([start]), "end_positions": torch.tensor([end])})


@pytest.fixture(scope="module")
def fitted(tokenizer):
    """``fitted(cls, mixer)``: the head fitted once per module (the tagger or the answerer above)."""
    cache = {}

    def get(cls, mixer):
        if (cls, mixer) not in cache:
            fit = _keyword_tagger if cls is TnnForTokenClassification else _answerer
            cache[(cls, mixer)] = fit(tokenizer, mixer)
        return cache[(cls, mixer)]
    return get


@pytest.mark.parametrize("mixer", MIXERS)
def test_token_classification_pipeline_on_a_saved_folder(tmp_path, tokenizer, fitted, mixer):
    folder = save_with_tokenizer(fitted(TnnForTokenClassification, mixer), tokenizer, tmp_path)
    tagger = pipeline("token-classification", model=folder, trust_remote_code=True,
                      aggregation_strategy="simple")
    alone = tagger(CONTEXT)
    assert [(e["entity_group"], e["word"].strip()) for e in alone] == [("KW", KEYWORD)]
    batched = tagger([CONTEXT + " " + CONTEXT, CONTEXT], batch_size=2)[1]  # padded behind a longer input
    assert [(e["entity_group"], e["start"], e["end"]) for e in batched] == [
        (e["entity_group"], e["start"], e["end"]) for e in alone]
    assert batched[0]["score"] == pytest.approx(alone[0]["score"], abs=1e-5)


@pytest.mark.parametrize("mixer", MIXERS)
def test_question_answering_on_a_saved_folder(tmp_path, tokenizer, fitted, mixer):
    save_with_tokenizer(fitted(TnnForQuestionAnswering, mixer), tokenizer, tmp_path)
    model = AutoModelForQuestionAnswering.from_pretrained(tmp_path, trust_remote_code=True).eval()
    assert extract_answer(model, tokenizer, QUESTION, CONTEXT).strip() == ANSWER


def test_readme_recipe_tags_and_answers(tmp_path, monkeypatch, tokenizer, fitted):
    """The README's token-classification and question-answering snippet, run as written on fitted folders."""
    readme = (PROJECT_ROOT / "README.md").read_text()
    section = readme[readme.index("### Token classification and question answering"):]
    snippet = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    for name, cls in (("my-tnn-ner", TnnForTokenClassification), ("my-tnn-qa", TnnForQuestionAnswering)):
        save_with_tokenizer(fitted(cls, "dense"), tokenizer, tmp_path / name)
    monkeypatch.chdir(tmp_path)
    namespace = {}
    exec(snippet, namespace)
    assert namespace["context"] == CONTEXT and namespace["question"] == QUESTION
    assert [(e["entity_group"], e["word"].strip()) for e in namespace["entities"]] == [("KW", KEYWORD)]
    assert namespace["answer"].strip() == ANSWER


def test_question_answering_pipeline_is_gone_from_this_transformers(tmp_path, tokenizer):
    """transformers 5.3 removed ``pipeline("question-answering")``: the README shows the tokenizer + model recipe
    instead (``extract_answer``). If a version brings the pipeline back, this fails: then test the pipeline."""
    folder = save_with_tokenizer(TnnForQuestionAnswering(tiny_config_for(tokenizer)), tokenizer, tmp_path)
    with pytest.raises(KeyError, match="question-answering has been removed"):
        pipeline("question-answering", model=folder, trust_remote_code=True)


REMOTE_SCRIPT = """
    import json
    ids = torch.load({ids!r})
    scores, entities = {{}}, {{}}
    for job in json.loads({jobs!r}):
        folder = job["folder"]
        model = load_remote(job["auto"], folder)
        pair = transformers.AutoTokenizer.from_pretrained(folder)({question!r}, {context!r}, return_tensors="pt")
        with torch.no_grad():
            out, on_pair = model(input_ids=ids), model(**pair)
        scores[folder] = main_output(out)
        if job["auto"] == "AutoModelForTokenClassification":
            tagger = transformers.pipeline("token-classification", model=folder, trust_remote_code=True,
                                           aggregation_strategy="simple")
            assert type(tagger.model).__module__.startswith("transformers_modules")
            entities[folder] = [(e["entity_group"], e["word"]) for e in tagger({context!r})]
        else:
            scores[folder + "|pair"] = torch.stack([on_pair.start_logits[0], on_pair.end_logits[0]])
    torch.save(scores, {result!r})
    with open({entities_file!r}, "w") as f:
        json.dump(entities, f)
"""

# (head, causal, mixer) of the folders loaded as remote code: the fitted heads, and untrained causal ones.
REMOTE_CASES = [(cls, *case) for cls in HEADS for case in [*with_mixers([(False,)]), (True, "dense")]]


@pytest.fixture(scope="module")
def remote_code_run(tmp_path_factory, tokenizer, fitted):
    """Save every case, then load them all as remote code in ONE subprocess where modeling_tnn is blocked: their
    scores, the token-classification pipeline, and the QA scores on the encoded question and context."""
    root = tmp_path_factory.mktemp("remote_heads")
    ids = torch.randint(5, len(tokenizer), (2, 11))
    torch.save(ids, root / "ids.pt")
    models, jobs = {}, []
    for i, (cls, causal, mixer) in enumerate(REMOTE_CASES):
        folder = str(root / f"head{i}")
        if causal:
            model = cls(tiny_config_for(tokenizer, mixer, causal=True, num_labels=3, **LABELS)).eval()
        else:
            model = fitted(cls, mixer)
        save_with_tokenizer(model, tokenizer, folder)
        models[(cls, causal, mixer)] = (folder, model)
        jobs.append({"folder": folder, "auto": cls._auto_class})
    script = REMOTE_SCRIPT.format(ids=str(root / "ids.pt"), jobs=json.dumps(jobs), question=QUESTION,
                                  context=CONTEXT, result=str(root / "scores.pt"),
                                  entities_file=str(root / "entities.json"))
    run_with_package_blocked(script, root, extra_env={"TRANSFORMERS_VERBOSITY": "error"})
    return ids, models, torch.load(root / "scores.pt"), json.loads((root / "entities.json").read_text())


@pytest.mark.slow
@pytest.mark.parametrize("cls, causal, mixer", REMOTE_CASES)
def test_remote_code_without_the_package(remote_code_run, tokenizer, cls, causal, mixer):
    ids, models, scores, entities = remote_code_run
    folder, model = models[(cls, causal, mixer)]
    with torch.no_grad():
        torch.testing.assert_close(scores[folder], main_output(model(input_ids=ids)), atol=0, rtol=0)
    if causal:
        return  # untrained: the scores are what is compared
    if cls is TnnForTokenClassification:
        assert [(group, word.strip()) for group, word in entities[folder]] == [("KW", KEYWORD)]
    else:
        enc = tokenizer(QUESTION, CONTEXT, return_offsets_mapping=True)
        start, end = answer_span(*scores[folder + "|pair"], enc.sequence_ids(0))
        assert CONTEXT[enc["offset_mapping"][start][0]:enc["offset_mapping"][end][1]].strip() == ANSWER
