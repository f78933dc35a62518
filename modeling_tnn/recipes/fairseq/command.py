"""``convert_fairseq_checkpoint.py``'s command line: the flags, the conversion, and one ``error:`` line with exit
status 2 for what :func:`.conversion.convert_fairseq_checkpoint` refuses."""

from __future__ import annotations

import argparse

from .conversion import convert_fairseq_checkpoint


def build_parser() -> argparse.ArgumentParser:
    """The command-line flags."""
    parser = argparse.ArgumentParser(prog="convert_fairseq_checkpoint.py",
                                     description="Convert a TNN checkpoint trained with the authors' fairseq code "
                                                 "(OpenNLPLab/fairseq-evo) into a Hub-ready folder.")
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
