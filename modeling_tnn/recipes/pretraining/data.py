"""Pretraining data: its flags (:class:`DataTrainingArguments`), a Hub dataset, local text/csv/json files or the
embedded corpus; the tokenizer (loaded or trained on the fly); blocks of ``--block_size`` tokens; a resumable
shuffle."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from functools import partial
from itertools import chain
from pathlib import Path
from typing import Any

import torch
from accelerate import Accelerator
from datasets import Dataset, DatasetDict, load_dataset
from torch.utils.data import Sampler
from transformers import (
    AutoTokenizer,
    PreTrainedTokenizerBase,
)

from ..common.argument_groups import flag
from ..common.flag_checks import UsageError, first_line, hub_hint
from .corpus import embedded_splits
from .tokenizer import train_byte_level_bpe

TEXT_EXTENSIONS = {"txt": "text", "text": "text", "raw": "text", "tokens": "text", "csv": "csv", "json": "json",
                   "jsonl": "json"}


def data_file_type(path: str, flag: str) -> str:
    if not Path(path).is_file():
        raise UsageError(f"{flag} {path!r} does not exist (or is not a file).")
    extension = path.rsplit(".", 1)[-1].lower() if "." in Path(path).name else ""
    if extension not in TEXT_EXTENSIONS:
        raise UsageError(f"{flag} {path!r}: unsupported extension {extension!r}; use one of "
                         f"{sorted(TEXT_EXTENSIONS)}.")
    return TEXT_EXTENSIONS[extension]


@dataclass
class DataTrainingArguments:
    """The ``data`` flags: where the text comes from, how much of it is held out and evaluated, how it is tokenized."""

    title = "data"  # the --help section

    dataset_name: str | None = flag(help="a Hub dataset (needs the network)")
    dataset_config_name: str | None = flag(help="the configuration of --dataset_name")
    train_file: str | None = flag(help="a local .txt/.csv/.json(l) training file")
    validation_file: str | None = flag(help="a local validation file (default: a split of the training data)")
    validation_split_percentage: int | None = flag(
        type=int, help="%% of the training data held out when there is no validation split (default 5; 10 for the "
                       "embedded corpus)")
    no_keep_linebreaks: bool = flag(False, "drop line breaks of .txt files", action="store_true")
    text_column: str | None = flag(help="the text column (default: 'text', else the first column)")
    max_eval_samples: int | None = flag(type=int, help="evaluate on at most this many blocks (periodic eval)")
    preprocessing_num_workers: int | None = flag(type=int, help="processes for tokenization")
    packing: str = flag("concatenate", "how rows fill the blocks: 'concatenate' (run_clm's: a block mixes the rows it "
                        "spans) or 'documents' (each row mixed alone inside its block: position_ids restart at 0 at "
                        "every row and block start, and the causal loss skips each row's first token; TNN models "
                        "only, see docs/packed-sequences.md)", choices=["concatenate", "documents"])

    def check(self) -> None:
        """Raise :class:`UsageError` for data flags that cannot work, before anything is loaded."""
        if self.max_eval_samples is not None and self.max_eval_samples < 1:
            raise UsageError(f"--max_eval_samples must be a positive integer, got {self.max_eval_samples}.")
        if self.validation_split_percentage is not None and not 0 < self.validation_split_percentage < 100:
            raise UsageError(f"--validation_split_percentage must lie in (0, 100), got "
                             f"{self.validation_split_percentage}.")
        if self.dataset_name and self.train_file:
            raise UsageError("Pass either --dataset_name or --train_file, not both.")
        if self.validation_file and not self.train_file:
            raise UsageError("--validation_file needs --train_file.")
        if self.train_file:
            kind = data_file_type(self.train_file, "--train_file")
            if self.validation_file and data_file_type(self.validation_file, "--validation_file") != kind:
                raise UsageError("--train_file and --validation_file must have the same format.")
            for name in ("train_file", "validation_file"):
                path = getattr(self, name)
                if path and Path(path).stat().st_size == 0:
                    raise UsageError(f"--{name} {path!r} is empty.")

    def source(self, split: str) -> str:
        """How the flags name a split's data, for error messages: ``--train_file 'a.csv'``, ``--dataset_name 'x'``..."""
        if self.train_file:
            if split == "validation" and self.validation_file:
                return f"--validation_file {self.validation_file!r}"
            held_out = "" if split == "train" else f" (the held-out {self.validation_split_percentage or 5}%)"
            return f"--train_file {self.train_file!r}{held_out}"
        if self.dataset_name:
            return f"--dataset_name {self.dataset_name!r} ({split} split)"
        return f"the {split} data"


class EpochShuffleSampler(Sampler[int]):
    """A permutation that depends only on ``seed + epoch``, never on the global RNG: a resumed run sees the same
    order, and every process of a distributed run shuffles identically (Accelerate then shards the batches)."""

    def __init__(self, num_samples: int, seed: int):
        self.num_samples, self.seed, self.epoch = num_samples, seed, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return self.num_samples

    def __iter__(self) -> Iterator[int]:
        generator = torch.Generator().manual_seed(self.seed + self.epoch)
        yield from torch.randperm(self.num_samples, generator=generator).tolist()


def load_raw_datasets(data: DataTrainingArguments) -> DatasetDict:
    """``train`` and ``validation`` splits from the Hub, local files, or the embedded corpus (in that order)."""
    if data.dataset_name:
        raw = load_dataset(data.dataset_name, data.dataset_config_name)
        if "validation" not in raw:
            p = data.validation_split_percentage or 5
            raw["validation"] = load_dataset(data.dataset_name, data.dataset_config_name, split=f"train[:{p}%]")
            raw["train"] = load_dataset(data.dataset_name, data.dataset_config_name, split=f"train[{p}%:]")
        return raw
    if data.train_file:
        kind = data_file_type(data.train_file, "--train_file")
        files = {"train": data.train_file}
        if data.validation_file:
            files["validation"] = data.validation_file
        extra = {"keep_linebreaks": not data.no_keep_linebreaks} if kind == "text" else {}
        names = " / ".join(f"--{split}_file {path!r}" for split, path in files.items())
        try:
            raw = load_dataset(kind, data_files=files, **extra)
        except Exception as error:  # a parse error deep inside `datasets`: name the file(s) and the cause
            cause = error.__cause__ or error.__context__ or error
            if "corresponds to no data" in str(cause):
                raise UsageError(f"{names}: no data rows.") from None
            raise UsageError(f"{names}: cannot be read as {kind}: {first_line(cause)}") from None
        if "validation" not in raw:
            p = data.validation_split_percentage or 5
            try:
                raw["validation"] = load_dataset(kind, data_files=files, split=f"train[:{p}%]", **extra)
                raw["train"] = load_dataset(kind, data_files=files, split=f"train[{p}%:]", **extra)
            except Exception as error:
                if "corresponds to no data" not in str(error):
                    raise
                raise UsageError(f"--train_file {data.train_file!r} has {len(raw['train'])} rows: too few to hold "
                                 f"out --validation_split_percentage {p}%; pass a --validation_file, a larger "
                                 "percentage or more data.") from None
        return raw
    # Documents are separated by a blank line, as they would be in a text file.
    splits = embedded_splits((data.validation_split_percentage or 10) / 100)
    return DatasetDict({name: Dataset.from_dict({"text": [d + "\n\n" for d in docs]}) for name, docs in splits.items()})


def is_text_feature(feature: Any) -> bool:
    return getattr(feature, "dtype", None) in ("string", "large_string")


def text_column_of(dataset: Dataset, requested: str | None, source: str = "the dataset") -> str:
    """``requested``, else ``"text"``, else the first column; it must hold text. Raises :class:`UsageError` naming
    ``source`` (the file or dataset), the column and the available columns with their types otherwise."""
    columns = dataset.column_names
    if not columns:
        raise UsageError(f"{source} has no columns.")

    def described() -> str:
        return ", ".join(f"{name} ({getattr(dataset.features[name], 'dtype', type(dataset.features[name]).__name__)})"
                         for name in columns)

    if requested:
        if requested not in columns:
            raise UsageError(f"{source}: --text_column {requested!r} is not a column; columns: {described()}.")
        column, how = requested, "--text_column"
    else:
        column = "text" if "text" in columns else columns[0]
        how = "the default text column" if column == "text" else "the first column, used as there is no 'text' column"
    if not is_text_feature(dataset.features[column]):
        kind = getattr(dataset.features[column], "dtype", type(dataset.features[column]).__name__)
        raise UsageError(f"{source}: column {column!r} ({how}) holds {kind} values, not text; columns: "
                         f"{described()}; pick a text column with --text_column.")
    return column


def group_texts(examples: dict[str, list], block_size: int, documents: bool = False) -> dict[str, list]:
    """Concatenate the token lists of a batch of rows and cut them into ``block_size`` chunks (the remainder of the
    batch is dropped), as HF's run_clm/run_mlm do. With ``documents`` each block also gets ``position_ids`` that
    restart at 0 where a row (a document) starts and at the block's start, so that the model mixes each document's
    part of the block alone (``--packing documents``)."""
    if documents:  # each row's positions, before the rows are concatenated
        examples = {**examples, "position_ids": [list(range(len(ids))) for ids in examples["input_ids"]]}
    concatenated = {key: list(chain.from_iterable(values)) for key, values in examples.items()}
    total = len(concatenated["input_ids"]) // block_size * block_size
    grouped = {key: [values[i: i + block_size] for i in range(0, total, block_size)]
               for key, values in concatenated.items()}
    if documents:  # a document cut by a block's start continues as a document of its own in that block
        grouped["position_ids"] = [[p - block[0] if i < (block.index(0) if 0 in block else len(block)) else p
                                    for i, p in enumerate(block)] for block in grouped["position_ids"]]
    return grouped


def load_tokenizer(source: str, flag: str, trust_remote_code: bool = False) -> PreTrainedTokenizerBase:
    """``AutoTokenizer.from_pretrained(source)``; a failure raises one :class:`UsageError` naming ``flag``, the option
    ``source`` came from."""
    try:
        return AutoTokenizer.from_pretrained(source, trust_remote_code=trust_remote_code)
    except (OSError, ValueError) as error:
        raise UsageError(f"{flag} {source!r}: {hub_hint(source)}no tokenizer could be loaded "
                         f"({first_line(error)}).") from None


def train_tokenizer(raw: DatasetDict, text_column: str, vocab_size: int, masked: bool, save_dir: str | Path,
                    accelerator: Accelerator) -> PreTrainedTokenizerBase:
    """A byte-level BPE trained on the training split: the main process trains it and saves it in ``save_dir``,
    the others load it from there."""
    save_dir = Path(save_dir)
    with accelerator.main_process_first():
        if accelerator.is_main_process:
            texts = (text for text in raw["train"][text_column] if text)
            # A masked LM gets RoBERTa's template (<s> A </s></s> B </s>), so a later sentence-pair finetune (GLUE)
            # sees a separator between the two sentences; a causal LM keeps plain byte-level text.
            tokenizer = train_byte_level_bpe(texts, vocab_size=vocab_size, add_bos_eos=masked)
            save_dir.mkdir(parents=True, exist_ok=True)
            tokenizer.save_pretrained(save_dir)
        else:
            tokenizer = AutoTokenizer.from_pretrained(str(save_dir))
    return tokenizer


def tokenize_and_group(data: DataTrainingArguments, raw: DatasetDict, tokenizer: PreTrainedTokenizerBase,
                       accelerator: Accelerator, text_column: str, *, block_size: int, masked: bool,
                       eval_lengths: list[int]) -> tuple[DatasetDict, torch.Tensor | None]:
    """Blocks of ``block_size`` tokens for both splits, and (with ``eval_lengths``, the --eval_lengths) the
    validation split as one token stream. Raises :class:`UsageError` when a split is shorter than one block."""

    def tokenize(examples: dict[str, list]) -> dict[str, list]:
        texts = [text if text is not None else "" for text in examples[text_column]]  # empty CSV cells are None
        return tokenizer(texts, return_special_tokens_mask=masked, return_attention_mask=False)

    with accelerator.main_process_first():
        tokenized = DatasetDict({
            split: raw[split].map(tokenize, batched=True, num_proc=data.preprocessing_num_workers,
                                  remove_columns=raw[split].column_names, desc=f"tokenizing {split}")
            for split in ("train", "validation")
        })
        grouped = tokenized.map(partial(group_texts, block_size=block_size, documents=data.packing == "documents"),
                                batched=True,
                                num_proc=data.preprocessing_num_workers, desc=f"grouping into {block_size}")
    for split in ("train", "validation"):
        if len(grouped[split]) == 0:
            tokens = sum(len(ids) for ids in tokenized[split]["input_ids"])
            raise UsageError(f"--block_size {block_size} is larger than the {split} data ({tokens} tokens in "
                             f"{data.source(split)}): use a smaller --block_size or more data.")
    stream = None
    if eval_lengths:
        stream = torch.tensor(list(chain.from_iterable(tokenized["validation"]["input_ids"])), dtype=torch.long)
        if len(stream) < eval_lengths[-1]:
            raise UsageError(f"--eval_lengths {eval_lengths[-1]} is longer than the validation data "
                             f"({len(stream)} tokens).")
    if data.max_eval_samples:
        grouped["validation"] = grouped["validation"].select(range(min(data.max_eval_samples,
                                                                       len(grouped["validation"]))))
    grouped.set_format("torch")
    return grouped, stream
