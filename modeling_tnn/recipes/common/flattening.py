"""A padding-free collator for classification: ``transformers.DataCollatorWithFlattening`` drops a classification
label (it makes up LM labels), so finetuning (``finetune_glue.py --padding_free``) flattens with this one."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch


class DocumentFlatteningCollator:
    """Concatenates a batch's ``input_ids`` into one row with ``position_ids`` restarting at 0 at every example, and
    keeps one label per example (``label`` or ``labels``: class ids, floats for regression, or multi-hot rows) in
    example order, which is the order in which TNN's sequence classifier pools the documents of a packed row.
    Other fields (``attention_mask``, ``token_type_ids``, ``idx``) are dropped: a packed row has no padding."""

    def __call__(self, features: Sequence[Mapping[str, Any]]) -> dict[str, torch.Tensor]:
        ids = [list(feature["input_ids"]) for feature in features]
        if not ids or any(not row for row in ids):
            raise ValueError("DocumentFlatteningCollator: every example needs at least one token.")
        batch = {"input_ids": torch.tensor([[token for row in ids for token in row]], dtype=torch.long),
                 "position_ids": torch.tensor([[i for row in ids for i in range(len(row))]], dtype=torch.long)}
        key = "label" if "label" in features[0] else "labels" if "labels" in features[0] else None
        if key is not None:
            labels = [feature[key] for feature in features]
            labels = [label.tolist() if isinstance(label, torch.Tensor) else label for label in labels]
            floating = any(isinstance(value, float) for label in labels
                           for value in (label if isinstance(label, list) else [label]))
            batch["labels"] = torch.tensor(labels, dtype=torch.float if floating else torch.long)
        return batch
