"""Pretraining data: a Hub dataset, local text/csv/json files or the embedded corpus; the tokenizer (loaded or trained
on the fly); blocks of ``--block_size`` tokens; a resumable shuffle."""

from __future__ import annotations

import argparse
from collections.abc import Iterator
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

from ..common.flag_checks import UsageError, first_line, hub_hint
from ..common.run_files import TOKENIZER_FILES
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


def load_raw_datasets(args: argparse.Namespace) -> DatasetDict:
    """``train`` and ``validation`` splits from the Hub, local files, or the embedded corpus (in that order)."""
    if args.dataset_name:
        raw = load_dataset(args.dataset_name, args.dataset_config_name)
        if "validation" not in raw:
            p = args.validation_split_percentage or 5
            raw["validation"] = load_dataset(args.dataset_name, args.dataset_config_name, split=f"train[:{p}%]")
            raw["train"] = load_dataset(args.dataset_name, args.dataset_config_name, split=f"train[{p}%:]")
        return raw
    if args.train_file:
        kind = data_file_type(args.train_file, "--train_file")
        files = {"train": args.train_file}
        if args.validation_file:
            files["validation"] = args.validation_file
        extra = {"keep_linebreaks": not args.no_keep_linebreaks} if kind == "text" else {}
        names = " / ".join(f"--{split}_file {path!r}" for split, path in files.items())
        try:
            raw = load_dataset(kind, data_files=files, **extra)
        except Exception as error:  # a parse error deep inside `datasets`: name the file(s) and the cause
            cause = error.__cause__ or error.__context__ or error
            if "corresponds to no data" in str(cause):
                raise UsageError(f"{names}: no data rows.") from None
            raise UsageError(f"{names}: cannot be read as {kind}: {first_line(cause)}") from None
        if "validation" not in raw:
            p = args.validation_split_percentage or 5
            try:
                raw["validation"] = load_dataset(kind, data_files=files, split=f"train[:{p}%]", **extra)
                raw["train"] = load_dataset(kind, data_files=files, split=f"train[{p}%:]", **extra)
            except Exception as error:
                if "corresponds to no data" not in str(error):
                    raise
                raise UsageError(f"--train_file {args.train_file!r} has {len(raw['train'])} rows: too few to hold "
                                 f"out --validation_split_percentage {p}%; pass a --validation_file, a larger "
                                 "percentage or more data.") from None
        return raw
    # Documents are separated by a blank line, as they would be in a text file.
    splits = embedded_splits((args.validation_split_percentage or 10) / 100)
    return DatasetDict({name: Dataset.from_dict({"text": [d + "\n\n" for d in docs]}) for name, docs in splits.items()})


def data_source(args: argparse.Namespace, split: str) -> str:
    """How the flags name a split's data, for error messages: ``--train_file 'a.csv'``, ``--dataset_name 'x'``..."""
    if args.train_file:
        if split == "validation" and args.validation_file:
            return f"--validation_file {args.validation_file!r}"
        held_out = "" if split == "train" else f" (the held-out {args.validation_split_percentage or 5}%)"
        return f"--train_file {args.train_file!r}{held_out}"
    if args.dataset_name:
        return f"--dataset_name {args.dataset_name!r} ({split} split)"
    return f"the {split} data"


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


def group_texts(examples: dict[str, list], block_size: int) -> dict[str, list]:
    """Concatenate the token lists of a batch of rows and cut them into ``block_size`` chunks (the remainder of the
    batch is dropped), as HF's run_clm/run_mlm do."""
    concatenated = {key: list(chain.from_iterable(values)) for key, values in examples.items()}
    total = len(concatenated["input_ids"]) // block_size * block_size
    return {key: [values[i: i + block_size] for i in range(0, total, block_size)]
            for key, values in concatenated.items()}


def get_tokenizer(args: argparse.Namespace, raw: DatasetDict, accelerator: Accelerator,
                  text_column: str) -> PreTrainedTokenizerBase:
    """The tokenizer: --tokenizer_name, the resumed checkpoint's, --model_name_or_path's, or a byte-level BPE trained
    on the training split (the main process trains it and saves it in --output_dir, the others load it)."""
    source = args.tokenizer_name or args.resume_path or args.model_name_or_path
    if args.tokenizer_name and Path(args.tokenizer_name).is_dir() and not any(
            (Path(args.tokenizer_name) / name).is_file() for name in TOKENIZER_FILES):
        raise UsageError(f"--tokenizer_name {args.tokenizer_name!r} is a folder without tokenizer files (none of "
                         f"{', '.join(TOKENIZER_FILES)}).")
    if source:
        try:
            return AutoTokenizer.from_pretrained(str(source), trust_remote_code=args.trust_remote_code)
        except (OSError, ValueError) as error:
            flag = ("--tokenizer_name" if args.tokenizer_name else
                    "--resume_from_checkpoint" if args.resume_path else "--model_name_or_path")
            raise UsageError(f"{flag} {str(source)!r}: {hub_hint(str(source))}no tokenizer could be loaded "
                             f"({first_line(error)}).") from None
    output_dir = Path(args.output_dir)
    with accelerator.main_process_first():
        if accelerator.is_main_process:
            texts = (text for text in raw["train"][text_column] if text)
            # A masked LM gets RoBERTa's template (<s> A </s></s> B </s>), so a later sentence-pair finetune (GLUE)
            # sees a separator between the two sentences; a causal LM keeps plain byte-level text.
            tokenizer = train_byte_level_bpe(texts, vocab_size=args.vocab_size, add_bos_eos=args.task == "mlm")
            output_dir.mkdir(parents=True, exist_ok=True)
            tokenizer.save_pretrained(output_dir)
        else:
            tokenizer = AutoTokenizer.from_pretrained(str(output_dir))
    return tokenizer


def tokenize_and_group(args: argparse.Namespace, raw: DatasetDict, tokenizer: PreTrainedTokenizerBase,
                       accelerator: Accelerator, text_column: str) -> tuple[DatasetDict, torch.Tensor | None]:
    """Blocks of ``--block_size`` tokens for both splits, and (with --eval_lengths) the validation split as one token
    stream. Raises :class:`UsageError` when a split is shorter than one block."""
    mlm = args.task == "mlm"

    def tokenize(examples: dict[str, list]) -> dict[str, list]:
        texts = [text if text is not None else "" for text in examples[text_column]]  # empty CSV cells are None
        return tokenizer(texts, return_special_tokens_mask=mlm, return_attention_mask=False)

    with accelerator.main_process_first():
        tokenized = DatasetDict({
            split: raw[split].map(tokenize, batched=True, num_proc=args.preprocessing_num_workers,
                                  remove_columns=raw[split].column_names, desc=f"tokenizing {split}")
            for split in ("train", "validation")
        })
        grouped = tokenized.map(partial(group_texts, block_size=args.block_size), batched=True,
                                num_proc=args.preprocessing_num_workers, desc=f"grouping into {args.block_size}")
    for split in ("train", "validation"):
        if len(grouped[split]) == 0:
            tokens = sum(len(ids) for ids in tokenized[split]["input_ids"])
            raise UsageError(f"--block_size {args.block_size} is larger than the {split} data ({tokens} tokens in "
                             f"{data_source(args, split)}): use a smaller --block_size or more data.")
    stream = None
    if args.eval_lengths_list:
        stream = torch.tensor(list(chain.from_iterable(tokenized["validation"]["input_ids"])), dtype=torch.long)
        if len(stream) < args.eval_lengths_list[-1]:
            raise UsageError(f"--eval_lengths {args.eval_lengths_list[-1]} is longer than the validation data "
                             f"({len(stream)} tokens).")
    if args.max_eval_samples:
        grouped["validation"] = grouped["validation"].select(range(min(args.max_eval_samples,
                                                                       len(grouped["validation"]))))
    grouped.set_format("torch")
    return grouped, stream
