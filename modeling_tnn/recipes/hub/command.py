"""The command line of ``publish.py``: build a run's Hub folder and model card, then upload it (or not, with
``--dry-run``)."""


from __future__ import annotations

import argparse
import logging
import shutil
import sys
import tempfile
from pathlib import Path

from .folder import write_card_dir
from .model_card import CardOptions
from .run_inspection import DatasetRef, PublishError
from .upload import publish_run


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="publish.py", description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run_dir", metavar="RUN_DIR", help="a training output folder (train_clm.py, train_mlm.py or "
                                                           "finetune_glue.py --output_dir)")
    parser.add_argument("--repo_id", required=True, help="the Hub model repository, ORG/NAME")
    parser.add_argument("--dry-run", "--dry_run", dest="dry_run", action="store_true",
                        help="build the folder, print its path and files, upload nothing")
    parser.add_argument("--private", action="store_true", help="create the repository as private (a repository "
                                                               "that already exists keeps its visibility)")
    parser.add_argument("--create_pr", action="store_true", help="upload as a pull request instead of to main")
    parser.add_argument("--output_dir", help="where to build the folder (default: a new temporary folder, kept for "
                                             "--dry-run and removed after an upload)")
    parser.add_argument("--overwrite", action="store_true", help="replace a non-empty --output_dir")
    parser.add_argument("--card_dir", help="also copy README.md and plots/ (no weights) here, e.g. model_cards/NAME")
    parser.add_argument("--code", choices=("run", "package"), default="run",
                        help="ship the model code saved in RUN_DIR (default: the code the results were measured "
                             "with) or the installed modeling_tnn code")
    parser.add_argument("--commit_message", help="default: 'Upload <architecture> (step N)'")
    card = parser.add_argument_group("model card")
    card.add_argument("--license", default="apache-2.0", help="license id for the card (default: %(default)s)")
    card.add_argument("--language", default="en", help="language of the training data (default: %(default)s)")
    card.add_argument("--dataset", help="Hub dataset id of the training/evaluation data (language-model runs)")
    card.add_argument("--dataset_name", help="display name of that data, e.g. 'WikiText-2'; enough on its own for "
                                             "local data that is not on the Hub")
    card.add_argument("--dataset_config", help="dataset config name, e.g. wikitext-2-raw-v1")
    card.add_argument("--dataset_split", default="validation", help="the evaluation split (default: %(default)s)")
    card.add_argument("--training_data", help="what the model trained on, when it differs from the evaluation data "
                                              "(e.g. 'WikiText-2 valid.txt')")
    card.add_argument("--base_model", help="Hub id of the model this one was finetuned from")
    card.add_argument("--hardware", help="what the run trained on, when its files do not say (e.g. '2 CPU cores')")
    card.add_argument("--example_text", help="the text of the usage snippet (fill-mask: put {mask} where the mask "
                                             "token goes)")
    card.add_argument("--description", help="replace the card's first paragraph")
    card.add_argument("--plot", action="append", default=[], metavar="PNG",
                      help="a PNG kept outside RUN_DIR to show in the card too (repeatable); RUN_DIR's *.png are "
                           "always included")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the command line; returns 0, or exits with status 2 and one ``error:`` line on an input error."""
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    options = CardOptions(
        license=args.license, language=args.language or None,
        dataset=DatasetRef(hub_id=args.dataset, name=args.dataset_name, config=args.dataset_config,
                              split=args.dataset_split),
        base_model=args.base_model, hardware=args.hardware, training_data=args.training_data,
        example_text=args.example_text, description=args.description, extra_plots=[Path(p) for p in args.plot])
    temporary = args.output_dir is None
    out_dir = Path(args.output_dir) if args.output_dir else Path(tempfile.mkdtemp(prefix="tnn-hub-"))
    try:
        files, commit = publish_run(args.run_dir, args.repo_id, out_dir, options=options, dry_run=args.dry_run,
                                       private=args.private, create_pr=args.create_pr, code=args.code,
                                       overwrite=args.overwrite, commit_message=args.commit_message)
    except PublishError as error:
        if temporary:
            shutil.rmtree(out_dir, ignore_errors=True)
        print(f"publish.py: error: {error}", file=sys.stderr)
        raise SystemExit(2) from None
    if args.card_dir:
        written = write_card_dir(out_dir, args.card_dir)
        print(f"model card: {', '.join(str(Path(args.card_dir) / name) for name in written)}")
    if args.dry_run:
        print(f"dry run: nothing uploaded. Hub folder for {args.repo_id}: {out_dir}")
        for name in files:
            print(f"  {name}  ({(out_dir / name).stat().st_size:,} bytes)")
        return 0
    url = getattr(commit, "pr_url", None) or getattr(commit, "commit_url", None) or commit
    print(f"uploaded {len(files)} files to {args.repo_id}: {url}")
    if temporary:
        shutil.rmtree(out_dir, ignore_errors=True)
    return 0

