#!/usr/bin/env python
"""A one-minute tour: train the small causal TNN preset on the embedded corpus, report the validation perplexity,
generate a few lines. Needs no Hub and no downloaded data."""

from __future__ import annotations

import argparse
import math
import time

import torch
from tqdm.auto import tqdm
from transformers import set_seed

from modeling_tnn import TnnForCausalLM, load_preset
from modeling_tnn.corpus import embedded_splits
from modeling_tnn.tokenizer_training import train_byte_level_bpe


def blocks(tokenizer, texts: list[str], block_size: int) -> torch.Tensor:
    ids = [i for t in texts for i in tokenizer(t + "\n\n").input_ids]
    n = len(ids) // block_size
    return torch.tensor(ids[: n * block_size]).view(n, block_size)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=60, help="training time budget")
    parser.add_argument("--block_size", type=int, default=128)
    parser.add_argument("--batch_size", type=int, default=16)
    parser.add_argument("--vocab_size", type=int, default=2048)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    set_seed(args.seed)

    splits = embedded_splits()
    tokenizer = train_byte_level_bpe(splits["train"], vocab_size=args.vocab_size)
    train, valid = blocks(tokenizer, splits["train"], args.block_size), blocks(tokenizer, splits["validation"],
                                                                               args.block_size)
    config = load_preset("small", vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id,
                         bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id)
    model = TnnForCausalLM(config)
    print(f"small TNN: {model.num_parameters() / 1e6:.2f}M parameters, {len(train)} training blocks "
          f"of {args.block_size} tokens")
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-3, weight_decay=0.01)

    start, step = time.time(), 0
    with tqdm(total=round(args.seconds), unit="s", desc="training") as bar:
        while (elapsed := time.time() - start) < args.seconds:
            batch = train[torch.randint(len(train), (args.batch_size,))]
            loss = model(input_ids=batch, labels=batch).loss
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            optimizer.zero_grad()
            step += 1
            bar.update(round(time.time() - start) - bar.n)
            bar.set_postfix(step=step, loss=f"{loss.item():.3f}")

    model.eval()
    with torch.no_grad():
        losses = [model(input_ids=b, labels=b).loss for b in valid.split(args.batch_size)]
    print(f"validation perplexity after {step} steps: {math.exp(torch.stack(losses).mean().item()):.2f}")
    for prompt in ("The assert statement", "A function definition"):
        ids = tokenizer(prompt, return_tensors="pt").input_ids
        out = model.generate(ids, max_new_tokens=40, do_sample=True, top_k=20, temperature=0.8,
                             pad_token_id=tokenizer.pad_token_id)
        print("---", tokenizer.decode(out[0], skip_special_tokens=True))


if __name__ == "__main__":
    main()
