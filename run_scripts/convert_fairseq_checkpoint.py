#!/usr/bin/env python
"""Convert a TNN checkpoint trained with the authors' fairseq code (OpenNLPLab/fairseq-evo) into a Hub-ready folder.

Examples::

    # the WikiText-103 causal LM (arch tnn_v2_decay_99_pre), with its fairseq dictionary as a tokenizer
    python run_scripts/convert_fairseq_checkpoint.py --checkpoint_path checkpoints/tnn/checkpoint_best.pt \\
        --dictionary data-bin/wikitext-103/dict.txt --pytorch_dump_folder_path outputs/tnn-wt103-fairseq

The folder holds config.json (with auto_map), the model code and model.safetensors (and the tokenizer files with
--dictionary); it loads with AutoModelForCausalLM or AutoModelForMaskedLM, with or without trust_remote_code. What is
refused, and why, is described in modeling_tnn/recipes/fairseq/conversion.py and the README; a refusal prints
``convert_fairseq_checkpoint.py: error: ...`` and exits with status 2 before anything is written.
"""

from __future__ import annotations

import argparse

from modeling_tnn.recipes.fairseq.conversion import convert_fairseq_checkpoint


def build_parser() -> argparse.ArgumentParser:
    """The command-line flags."""
    parser = argparse.ArgumentParser(prog="convert_fairseq_checkpoint.py", description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkpoint_path", required=True, help="the fairseq checkpoint (.pt)")
    parser.add_argument("--pytorch_dump_folder_path", required=True, help="the output folder")
    parser.add_argument("--dictionary", default=None,
                        help="fairseq's dict.txt for this model: written as a tokenizer mapping its symbols to ids")
    parser.add_argument("--trust_checkpoint", action="store_true",
                        help="load with torch.load(weights_only=False) when the file holds more than tensors and an "
                             "argparse.Namespace (can run code: only for files you trust)")
    parser.add_argument("--overwrite", action="store_true", help="replace a non-empty output folder")
    return parser


def main(argv: list[str] | None = None) -> None:
    """Parse the flags, convert, print what was written."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        result = convert_fairseq_checkpoint(args.checkpoint_path, args.pytorch_dump_folder_path,
                                            dictionary_path=args.dictionary, trust_checkpoint=args.trust_checkpoint,
                                            overwrite=args.overwrite)
    except (ValueError, FileNotFoundError) as err:
        parser.exit(2, f"{parser.prog}: error: {err}\n")
    config = result.config
    print(f"Converted {result.num_tensors} tensors into a {result.kind} ({config.num_hidden_layers} layers, width "
          f"{config.hidden_size}, vocabulary {config.vocab_size}, decay_gamma {config.decay_gamma!r}) at "
          f"{result.output_dir}{' with the dictionary tokenizer' if result.tokenizer_written else ''}.")
    for note in result.notes:
        print(f"note: {note}")


if __name__ == "__main__":
    main()
