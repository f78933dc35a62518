"""LRA ListOps: the evaluator against hand-computed values, the generator and its checks, the tokenizer, BERT's size
matching and a 2-step run of the training script for a TNN and for BERT."""

from __future__ import annotations

import json
import random
from collections import Counter

import numpy as np
import pytest

from modeling_tnn import load_preset
from modeling_tnn.recipes.listops.data import (
    HEADER,
    ListOpsDataError,
    apply_operator,
    build_listops_tokenizer,
    check_listops_dir,
    evaluate_expression,
    evaluate_tree,
    expression_length,
    generate_rows,
    generate_tree,
    make_listops,
    read_tsv,
    split_file,
    tree_to_string,
    write_tsv,
)
from modeling_tnn.recipes.listops.training import (
    ListOpsArguments,
    bert_parameter_count,
    build_model,
    match_bert_sizes,
    parameter_count,
    summarize_runs,
)

from tests.support import script_main


# -- evaluator ---------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("text, value", [
    ("[MAX 2 9 ]", 9),
    ("[MIN 3 [MAX 5 1 ] 4 ]", 3),  # MAX(5, 1) = 5; MIN(3, 5, 4) = 3
    ("[MED 1 2 3 4 ]", 2),  # median 2.5 rounded down
    ("[MED 7 [SM 5 6 ] 3 ]", 3),  # SM(5, 6) = 11 mod 10 = 1; MED(7, 1, 3) = 3
    ("[SM 9 9 9 ]", 7),  # 27 mod 10
    ("[MAX [MIN 8 [SM 4 4 ] ] [MED 0 9 ] 1 ]", 8),  # MIN(8, 8) = 8, MED(0, 9) = 4 (4.5 rounded down), MAX = 8
    ("( ( ( [MAX 2 ) 9 ) ] )", 9),  # LRA's text form with parentheses
    ("5", 5),
])
def test_evaluator_hand_computed(text, value):
    assert evaluate_expression(text) == value


@pytest.mark.parametrize("text, message", [
    ("[MAX 2 9", "left open"), ("] 3", "closes no operator"), ("[FOO 1 2 ]", "unknown token"),
    ("[MAX 1 2 ] 3", "follows a complete expression"), ("( )", "empty"), ("[SM ]", "no arguments"),
])
def test_evaluator_rejects_malformed(text, message):
    with pytest.raises(ListOpsDataError, match=message):
        evaluate_expression(text)


def test_median_matches_numpy_and_text_form_matches_lra():
    rng = np.random.default_rng(0)
    for _ in range(200):
        values = rng.integers(0, 10, size=int(rng.integers(1, 11))).tolist()
        assert apply_operator("[MED", values) == int(np.median(values))
    # LRA nests every argument: k arguments give k + 1 opening parentheses before the operator.
    assert tree_to_string(("[MAX", [2, 9])) == "( ( ( [MAX 2 ) 9 ) ] )"
    assert tree_to_string(("[SM", [1, ("[MIN", [3, 4])])) == "( ( ( [SM 1 ) ( ( ( [MIN 3 ) 4 ) ] ) ) ] )"


def test_tree_value_and_length_agree_with_the_parsed_text():
    rng = random.Random(1)
    checked = 0
    while checked < 100:
        tree, length = generate_tree(rng)
        if isinstance(tree, int):
            continue
        text = tree_to_string(tree)
        assert expression_length(text) == length
        assert evaluate_expression(text) == evaluate_tree(tree)
        checked += 1


# -- generator and checks ---------------------------------------------------------------------------------------------
def test_default_rows_follow_lra_lengths_and_are_deterministic():
    rows = generate_rows(3, seed=5, progress=False)
    assert all(500 < expression_length(text) < 2000 for text, _ in rows)
    assert rows == generate_rows(3, seed=5, progress=False)
    assert rows != generate_rows(3, seed=6, progress=False)


def test_make_listops_script_writes_checked_files(tmp_path):
    out = tmp_path / "listops"
    script_main("make_listops")(["--output_dir", str(out), "--num_train", "12", "--num_val", "4",
                                 "--num_test", "4", "--min_length", "10", "--max_length", "60", "--no_progress"])
    first = {split: split_file(out, split).read_text() for split in ("train", "val", "test")}
    assert all(text.startswith("\t".join(HEADER) + "\n") for text in first.values())
    assert [len(read_tsv(split_file(out, s))) for s in ("train", "val", "test")] == [12, 4, 4]
    make_listops(out, 12, 4, 4, seed=0, min_length=10, max_length=60, progress=False)  # same seed, same files
    assert {split: split_file(out, split).read_text() for split in first} == first
    # The default bounds are LRA's: these short rows fail them.
    with pytest.raises(ListOpsDataError, match=r"length \d+ outside \(500, 2000\)"):
        check_listops_dir(out)


@pytest.mark.parametrize("corruption, message", [
    ("label", "label .* evaluates to"), ("duplicate", "test row 0 duplicates train row 3"),
    ("length", "length .* outside"), ("header", "header must be"), ("not_int", "is not an integer"),
])
def test_checks_catch_a_corrupted_file(tmp_path, corruption, message):
    make_listops(tmp_path, 6, 3, 3, seed=2, min_length=10, max_length=60, progress=False)
    assert check_listops_dir(tmp_path, 10, 60).counts == {"train": 6, "val": 3, "test": 3}
    train, test = read_tsv(split_file(tmp_path, "train")), read_tsv(split_file(tmp_path, "test"))
    if corruption == "label":
        source, target = test[1]
        test[1] = (source, (target + 1) % 10)
    elif corruption == "duplicate":
        test[0] = train[3]
    elif corruption == "length":
        test[2] = ("[MAX 1 2 ]", 2)
    write_tsv(split_file(tmp_path, "test"), test)
    if corruption == "header":
        path = split_file(tmp_path, "val")
        path.write_text("Input\tLabel\n" + path.read_text().split("\n", 1)[1])
    elif corruption == "not_int":
        path = split_file(tmp_path, "val")
        path.write_text(path.read_text().rsplit("\t", 1)[0] + "\tseven\n")
    with pytest.raises(ListOpsDataError, match=message):
        check_listops_dir(tmp_path, 10, 60)


def test_tokenizer_keeps_the_task_symbols_and_drops_parentheses():
    tokenizer = build_listops_tokenizer()
    text = tree_to_string(("[SM", [1, ("[MIN", [3, 4])]))
    ids = tokenizer(text)["input_ids"]
    assert tokenizer.convert_ids_to_tokens(ids) == ["[CLS]", "[SM", "1", "[MIN", "3", "4", "]", "]"]
    assert len(ids) == expression_length(text) + 1
    for text, _ in generate_rows(5, seed=3, min_length=20, max_length=200, progress=False):
        assert tokenizer.unk_token_id not in tokenizer(text)["input_ids"]
    with pytest.raises(ValueError, match="model must be one of"):
        ListOpsArguments(data_dir=".", model="gpt")


# -- models ----------------------------------------------------------------------------------------------------------
def test_bert_matches_the_lra_listops_tnn_size():
    tokenizer = build_listops_tokenizer()
    args = ListOpsArguments(data_dir=".", model="bert", preset="lra_listops")
    bert, sizes = build_model(args, len(tokenizer), tokenizer.pad_token_id)
    assert abs(sizes["bert_vs_tnn"] - 1) < 0.03
    assert bert.config.max_position_embeddings == 2048 and bert.config._attn_implementation == "sdpa"
    preset = load_preset("lra_listops")
    assert (bert.config.hidden_size, bert.config.num_hidden_layers) == (preset.hidden_size, preset.num_hidden_layers)
    hidden, layers, intermediate = match_bert_sizes(10**6, 128, 4, 18)
    assert parameter_count(bert) == bert_parameter_count(bert.config.hidden_size, bert.config.num_hidden_layers,
                                                         bert.config.intermediate_size, len(tokenizer))
    assert abs(bert_parameter_count(hidden, layers, intermediate, 18) / 10**6 - 1) < 0.01


@pytest.mark.slow
@pytest.mark.parametrize("model", ["tnn-ski", "bert"])
def test_training_script_smoke(tmp_path, model):
    data = tmp_path / "data"
    make_listops(data, 16, 4, 4, seed=0, min_length=10, max_length=60, progress=False)
    out = tmp_path / model
    results = script_main("train_listops")([
        "--data_dir", str(data), "--model", model, "--output_dir", str(out), "--max_steps", "2",
        "--per_device_train_batch_size", "4", "--eval_steps", "1", "--logging_steps", "1", "--save_strategy", "no",
        "--report_to", "none", "--disable_tqdm", "true"])
    saved = json.loads((out / "all_results.json").read_text())
    assert saved["run_model"] == model and saved["run_steps"] == 2 and 0 <= saved["test_accuracy"] <= 1
    assert saved["run_parameters"] == results["run_parameters"] > 0
    assert (out / "learning_curve.png").stat().st_size > 0
    summary = summarize_runs([out], tmp_path / "summary", data)
    assert f"| {model} |" in summary["table"] and (tmp_path / "summary" / "learning_curves.png").is_file()
    train, test = read_tsv(split_file(data, "train")), read_tsv(split_file(data, "test"))
    top = Counter(target for _, target in train).most_common(1)[0][0]
    assert summary["majority_class_test_accuracy"] == sum(t == top for _, t in test) / len(test)
    assert "| majority class" in summary["table"]
