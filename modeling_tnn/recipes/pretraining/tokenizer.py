"""Train a byte-level BPE tokenizer with ``tokenizers`` and wrap it as a transformers fast tokenizer."""

from __future__ import annotations

from collections.abc import Iterable

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import PreTrainedTokenizerFast

SPECIAL_TOKENS = {"pad_token": "<pad>", "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>",
                  "mask_token": "<mask>"}


def train_byte_level_bpe(texts: Iterable[str], vocab_size: int = 8192, min_frequency: int = 2,
                         add_bos_eos: bool = False, show_progress: bool = False) -> PreTrainedTokenizerFast:
    """A byte-level BPE tokenizer trained on ``texts``. ``vocab_size=256 + 5`` (no merges) gives a byte-level,
    i.e. character-level for ASCII, tokenizer. With ``add_bos_eos`` every encoded text is wrapped in ``<s> ... </s>``.
    """
    special = list(SPECIAL_TOKENS.values())
    if vocab_size < 256 + len(special):
        raise ValueError(f"vocab_size must be at least {256 + len(special)} (256 bytes + special tokens), "
                         f"got {vocab_size}.")
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=min_frequency, special_tokens=special,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=show_progress)
    tokenizer.train_from_iterator(texts, trainer=trainer)
    if add_bos_eos:
        tokenizer.post_processor = processors.TemplateProcessing(
            single="<s> $A </s>", pair="<s> $A </s> </s> $B </s>",
            special_tokens=[("<s>", tokenizer.token_to_id("<s>")), ("</s>", tokenizer.token_to_id("</s>"))],
        )
    else:
        tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, **SPECIAL_TOKENS)
