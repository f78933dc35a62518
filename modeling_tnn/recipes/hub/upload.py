"""Uploading a run to the Hub: one ``HfApi().upload_folder`` commit of the checked folder. The token is never read,
passed or printed here: huggingface_hub finds it itself (``HF_TOKEN`` or ``hf auth login``)."""

from __future__ import annotations

import logging
import tempfile
from pathlib import Path
from typing import Any

from .folder import build_hub_folder, check_folder, require_token, validate_repo_id
from .model_card import CardOptions
from .run_inspection import DatasetRef, inspect_run

logger = logging.getLogger(__name__)


def upload_folder(folder: str | Path, repo_id: str, *, private: bool = False, create_pr: bool = False,
                  commit_message: str = "Upload TNN model") -> Any:
    """Create ``repo_id`` when needed (``exist_ok=True``; ``private`` only applies to a new repository) and upload
    ``folder`` with one ``HfApi().upload_folder`` call. Returns the ``CommitInfo``."""
    from huggingface_hub import HfApi

    files = check_folder(folder)  # once more, right before the upload
    api = HfApi()
    api.create_repo(repo_id, repo_type="model", private=private, exist_ok=True)
    logger.info("uploading %d files to %s", len(files), repo_id)
    return api.upload_folder(repo_id=repo_id, folder_path=str(folder), repo_type="model",
                             commit_message=commit_message, create_pr=create_pr)


def publish_run(run_dir: str | Path, repo_id: str, out_dir: str | Path, *, options: CardOptions | None = None,
                dry_run: bool = False, private: bool = False, create_pr: bool = False, code: str = "run",
                overwrite: bool = False, commit_message: str | None = None) -> tuple[list[str], Any]:
    """Inspect ``run_dir``, build the Hub folder in ``out_dir`` and (unless ``dry_run``) upload it. Every check
    (run folder, results, weights, token, allow-list) runs before the upload. Returns (file list, CommitInfo or
    ``None``)."""
    validate_repo_id(repo_id)
    if not dry_run:
        require_token()
    info = inspect_run(run_dir)
    files = build_hub_folder(info, out_dir, repo_id, options, code=code, overwrite=overwrite)
    if dry_run:
        return files, None
    steps = info.results.get("train_steps") or info.trainer_state.get("global_step")
    message = commit_message or f"Upload {info.architecture}" + (f" (step {steps})" if steps else "")
    return files, upload_folder(out_dir, repo_id, private=private, create_pr=create_pr, commit_message=message)


def push_finished_run(run_dir: str | Path, repo_id: str, dataset: DatasetRef, *, private: bool = False,
                      commit_message: str | None = None) -> str:
    """The training scripts' ``--push_to_hub``: what ``publish.py`` does (an allow-listed folder with a model card
    whose model-index is read from the run's results on ``dataset``), built in a temporary folder, then one upload.
    Checkpoints, optimizer states, ``training_args.bin`` and logs never leave the machine. Returns the commit URL."""
    with tempfile.TemporaryDirectory() as tmp:
        _, commit = publish_run(run_dir, repo_id, Path(tmp) / "hub", options=CardOptions(dataset=dataset),
                                private=private, commit_message=commit_message)
    return str(getattr(commit, "commit_url", commit))
