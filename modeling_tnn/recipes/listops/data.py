"""The Long Range Arena ListOps task (Tay et al. 2021, after Nangia & Bowman 2018), built from its definition.

An expression is a tree: at depth ``< max_depth`` a node is an operator with probability 0.25, otherwise a digit
0-9; an operator takes ``randint(2, max_args)`` arguments and is one of ``[MIN``, ``[MAX``, ``[MED`` (median, rounded
down) and ``[SM`` (sum modulo 10), closed by ``]``. The length of an expression is its number of operator, digit and
``]`` tokens (LRA's definition: 2 per operator plus its children's lengths); LRA keeps the trees with
``500 < length < 2000``, drops duplicates and writes 96,000 / 2,000 / 2,000 rows to ``basic_{train,val,test}.tsv``
with the header ``Source<TAB>Target``. The text form nests every argument in ``( ... )`` as LRA's files do, e.g.
``( ( ( [MAX 2 ) 9 ) ] )``; the parentheses carry no information and LRA's input pipeline drops them, so the
tokenizer here drops them too and a row of length ``L`` becomes ``L`` tokens (plus ``[CLS]``).

This module holds the generator, an evaluator that parses the text (independent of the generator's own tree
evaluation, so the checks compare two implementations), the checks of a written folder, the word-level tokenizer
and the torch datasets the training script reads.
"""

from __future__ import annotations

import csv
import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm.auto import tqdm

OPERATORS: tuple[str, ...] = ("[MIN", "[MAX", "[MED", "[SM")
END = "]"
DIGITS: tuple[str, ...] = tuple(str(d) for d in range(10))
SPLITS: tuple[str, ...] = ("train", "val", "test")
HEADER: tuple[str, str] = ("Source", "Target")
NUM_CLASSES = 10
# LRA's defaults.
MIN_LENGTH, MAX_LENGTH = 500, 2000
MAX_DEPTH, MAX_ARGS, OPERATOR_PROBABILITY = 10, 10, 0.25
DEFAULT_COUNTS = {"train": 96_000, "val": 2_000, "test": 2_000}
# Special tokens of the word-level tokenizer; the task's own symbols follow them.
PAD, UNK, CLS = "[PAD]", "[UNK]", "[CLS]"
VOCABULARY: tuple[str, ...] = (PAD, UNK, CLS, *OPERATORS, END, *DIGITS)

Tree = int | tuple[str, list["Tree"]]


class ListOpsDataError(ValueError):
    """A ListOps folder or row that breaks the task's definition (length, label, duplicates, format)."""


# -- expressions ------------------------------------------------------------------------------------------------------
def generate_tree(
    rng: random.Random, depth: int = 1, max_depth: int = MAX_DEPTH, max_args: int = MAX_ARGS
) -> tuple[Tree, int]:
    """One random expression and its length (operators, digits and ``]``), by LRA's recursive recipe."""
    if depth < max_depth and rng.random() < OPERATOR_PROBABILITY:
        operator = rng.choice(OPERATORS)
        children, length = [], 2
        for _ in range(rng.randint(2, max_args)):
            child, child_length = generate_tree(rng, depth + 1, max_depth, max_args)
            children.append(child)
            length += child_length
        return (operator, children), length
    return rng.randint(0, 9), 1


def apply_operator(operator: str, values: Sequence[int]) -> int:
    """The value of ``operator`` on ``values``: MIN, MAX, MED (median, rounded down), SM (sum modulo 10)."""
    if not values:
        raise ListOpsDataError(f"operator {operator} has no arguments")
    if operator == "[MIN":
        return min(values)
    if operator == "[MAX":
        return max(values)
    if operator == "[SM":
        return sum(values) % 10
    if operator == "[MED":
        ordered = sorted(values)
        middle = len(ordered) // 2
        # An even count takes the mean of the two middle values, rounded down (int() of numpy's median, >= 0).
        return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) // 2
    raise ListOpsDataError(f"unknown operator {operator!r}; allowed: {list(OPERATORS)}")


def evaluate_tree(tree: Tree) -> int:
    """The value of a generated tree (recursive; used for the labels)."""
    if isinstance(tree, int):
        return tree
    operator, children = tree
    return apply_operator(operator, [evaluate_tree(child) for child in children])


def tree_to_string(tree: Tree) -> str:
    """LRA's text form: each argument nested in ``( ... )`` with the operator, then ``( ... ] )`` closing it."""
    parts: list[str] = []

    def emit(node: Tree) -> None:
        if isinstance(node, int):
            parts.append(str(node))
            return
        operator, children = node
        parts.extend(["("] * (len(children) + 1))
        parts.append(operator)
        for child in children:
            emit(child)
            parts.append(")")
        parts.extend([END, ")"])

    emit(tree)
    return " ".join(parts)


def expression_tokens(text: str) -> list[str]:
    """The tokens that carry meaning (operators, digits, ``]``): the text split on spaces without the parentheses."""
    return text.replace("(", " ").replace(")", " ").split()


def expression_length(text: str) -> int:
    """LRA's length of an expression: its number of operator, digit and ``]`` tokens."""
    return len(expression_tokens(text))


def evaluate_expression(text: str) -> int:
    """Parse and evaluate a ListOps expression (parentheses optional), with a stack; raises
    :class:`ListOpsDataError` naming the problem if the text is not one well-formed expression."""
    stack: list[tuple[str, list[int]]] = []
    result: int | None = None
    for position, token in enumerate(expression_tokens(text)):
        if result is not None:
            raise ListOpsDataError(f"token {token!r} at position {position} follows a complete expression")
        if token in OPERATORS:
            stack.append((token, []))
        elif token == END:
            if not stack:
                raise ListOpsDataError(f"']' at position {position} closes no operator")
            operator, values = stack.pop()
            value = apply_operator(operator, values)
            if stack:
                stack[-1][1].append(value)
            else:
                result = value
        elif token in DIGITS:
            if stack:
                stack[-1][1].append(int(token))
            else:
                result = int(token)
        else:
            raise ListOpsDataError(f"unknown token {token!r} at position {position}; allowed: "
                                   f"{list(OPERATORS) + [END] + list(DIGITS)} and parentheses")
    if stack:
        raise ListOpsDataError(f"{len(stack)} operator(s) left open at the end of the expression")
    if result is None:
        raise ListOpsDataError("empty expression")
    return result


# -- generation, files and checks ------------------------------------------------------------------------------------
def generate_rows(
    num_rows: int,
    seed: int = 0,
    min_length: int = MIN_LENGTH,
    max_length: int = MAX_LENGTH,
    max_depth: int = MAX_DEPTH,
    max_args: int = MAX_ARGS,
    progress: bool = True,
) -> list[tuple[str, int]]:
    """``num_rows`` distinct ``(expression, value)`` rows with ``min_length < length < max_length``, deterministic
    in ``seed`` (rejection sampling of :func:`generate_tree`, as LRA does)."""
    if num_rows < 0:
        raise ValueError(f"num_rows must be >= 0, got {num_rows}")
    if not 0 <= min_length < max_length - 1:
        raise ValueError(f"need 0 <= min_length < max_length - 1, got min_length={min_length}, max_length={max_length}")
    rng = random.Random(seed)
    seen: set[str] = set()
    rows: list[tuple[str, int]] = []
    with tqdm(total=num_rows, desc="ListOps expressions", unit="row", disable=not progress) as bar:
        while len(rows) < num_rows:
            tree, length = generate_tree(rng, 1, max_depth, max_args)
            if not min_length < length < max_length:
                continue
            text = tree_to_string(tree)
            if text in seen:
                continue
            seen.add(text)
            rows.append((text, evaluate_tree(tree)))
            bar.update(1)
    return rows


def split_file(data_dir: str | Path, split: str) -> Path:
    """``data_dir/basic_<split>.tsv``."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {list(SPLITS)}, got {split!r}")
    return Path(data_dir) / f"basic_{split}.tsv"


def write_tsv(path: str | Path, rows: Iterable[tuple[str, int]]) -> None:
    """Write rows under LRA's ``Source<TAB>Target`` header."""
    with open(path, "w", newline="") as handle:
        writer = csv.writer(handle, delimiter="\t", lineterminator="\n")
        writer.writerow(HEADER)
        writer.writerows((source, int(target)) for source, target in rows)


def read_tsv(path: str | Path) -> list[tuple[str, int]]:
    """Rows of one LRA ListOps tsv file; raises :class:`ListOpsDataError` on a wrong header or a malformed row."""
    path = Path(path)
    if not path.is_file():
        raise ListOpsDataError(f"{path} not found: generate the data with run_scripts/make_listops.py")
    with open(path, newline="") as handle:
        reader = csv.reader(handle, delimiter="\t")
        header = next(reader, None)
        if tuple(header or ()) != HEADER:
            raise ListOpsDataError(f"{path}: header must be {list(HEADER)}, got {header}")
        rows = []
        for line, record in enumerate(reader, start=2):
            if len(record) != 2:
                raise ListOpsDataError(f"{path} line {line}: expected 2 tab-separated fields, got {len(record)}")
            try:
                target = int(record[1])
            except ValueError:
                raise ListOpsDataError(f"{path} line {line}: Target {record[1]!r} is not an integer") from None
            rows.append((record[0], target))
    return rows


@dataclass
class ListOpsReport:
    """What :func:`check_listops_dir` verified: rows per split and the shortest / longest expression."""

    counts: dict[str, int]
    min_seen: int
    max_seen: int


def check_rows(
    rows_by_split: dict[str, list[tuple[str, int]]], min_length: int = MIN_LENGTH, max_length: int = MAX_LENGTH
) -> ListOpsReport:
    """Check every row: ``min_length < length < max_length``, label in 0-9 and equal to the expression's value
    (re-evaluated from the text), and no expression twice in or across splits. Raises :class:`ListOpsDataError`
    naming the split, row and problem."""
    first_seen: dict[str, tuple[str, int]] = {}
    lengths = []
    for split, rows in rows_by_split.items():
        for index, (source, target) in enumerate(rows):
            where = f"{split} row {index}"
            length = expression_length(source)
            if not min_length < length < max_length:
                raise ListOpsDataError(f"{where}: length {length} outside ({min_length}, {max_length})")
            value = evaluate_expression(source)
            if not 0 <= target < NUM_CLASSES or value != target:
                raise ListOpsDataError(f"{where}: label {target} but the expression evaluates to {value}")
            if source in first_seen:
                other_split, other_index = first_seen[source]
                raise ListOpsDataError(f"{where} duplicates {other_split} row {other_index}")
            first_seen[source] = (split, index)
            lengths.append(length)
    counts = {split: len(rows) for split, rows in rows_by_split.items()}
    return ListOpsReport(counts, min(lengths, default=0), max(lengths, default=0))


def check_listops_dir(
    data_dir: str | Path, min_length: int = MIN_LENGTH, max_length: int = MAX_LENGTH
) -> ListOpsReport:
    """Read ``basic_{train,val,test}.tsv`` of ``data_dir`` and :func:`check_rows` them."""
    return check_rows({split: read_tsv(split_file(data_dir, split)) for split in SPLITS}, min_length, max_length)


def make_listops(
    output_dir: str | Path,
    num_train: int = DEFAULT_COUNTS["train"],
    num_val: int = DEFAULT_COUNTS["val"],
    num_test: int = DEFAULT_COUNTS["test"],
    seed: int = 0,
    min_length: int = MIN_LENGTH,
    max_length: int = MAX_LENGTH,
    progress: bool = True,
) -> ListOpsReport:
    """Generate the three splits (distinct expressions, split in generation order), write them to ``output_dir``
    and check what was written (read back from disk)."""
    counts = {"train": num_train, "val": num_val, "test": num_test}
    for split, count in counts.items():
        if count < 1:
            raise ValueError(f"num_{split} must be >= 1, got {count}")
    rows = generate_rows(sum(counts.values()), seed, min_length, max_length, progress=progress)
    output_dir = Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    start = 0
    for split in SPLITS:
        write_tsv(split_file(output_dir, split), rows[start:start + counts[split]])
        start += counts[split]
    return check_listops_dir(output_dir, min_length, max_length)


# -- tokenizer and datasets ------------------------------------------------------------------------------------------
def build_listops_tokenizer():
    """A word-level ``PreTrainedTokenizerFast`` of the task's 15 symbols plus ``[PAD]``, ``[UNK]``, ``[CLS]``:
    parentheses are dropped (as LRA's pipeline does), tokens split on whitespace, ``[CLS]`` prepended."""
    from tokenizers import Regex, Tokenizer, models, normalizers, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    vocab = {token: index for index, token in enumerate(VOCABULARY)}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK))
    core.normalizer = normalizers.Replace(Regex(r"[()]"), " ")
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    core.post_processor = processors.TemplateProcessing(
        single=f"{CLS} $A", pair=f"{CLS} $A $B", special_tokens=[(CLS, vocab[CLS])])
    return PreTrainedTokenizerFast(
        tokenizer_object=core, pad_token=PAD, unk_token=UNK, cls_token=CLS, model_input_names=["input_ids",
                                                                                                "attention_mask"])


class ListOpsDataset(torch.utils.data.Dataset):
    """Tokenised rows of one split: ``{"input_ids", "attention_mask", "labels"}`` per item (unpadded)."""

    def __init__(self, rows: Sequence[tuple[str, int]], tokenizer, max_length: int = MAX_LENGTH):
        encoded = tokenizer([source for source, _ in rows], truncation=True, max_length=max_length)
        self.input_ids = encoded["input_ids"]
        self.labels = [int(target) for _, target in rows]

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> dict:
        ids = self.input_ids[index]
        return {"input_ids": ids, "attention_mask": [1] * len(ids), "labels": self.labels[index]}


def load_listops_split(
    data_dir: str | Path, split: str, tokenizer, max_length: int = MAX_LENGTH, max_samples: int | None = None,
    sort_by_length: bool = False,
) -> ListOpsDataset:
    """The first ``max_samples`` rows (all if ``None``) of ``basic_<split>.tsv``, tokenised; ``sort_by_length``
    orders them by length (for evaluation: batches of similar lengths waste little on padding)."""
    rows = read_tsv(split_file(data_dir, split))
    if max_samples is not None:
        rows = rows[:max_samples]
    if sort_by_length:
        rows = sorted(rows, key=lambda row: expression_length(row[0]))
    return ListOpsDataset(rows, tokenizer, max_length)
