"""Labels and their scores, best first: what the classification handlers answer.

`labels` BYTES [k] (the names of the model's `id2label`) and `scores` FP32 [k]: the softmax
of the logits, or their sigmoid for a multi-label model (`problem_type:
multi_label_classification`) or one with a single output, as transformers' pipeline
computes them. k is every label, or `top_k` where that is fewer.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from carpool.contract.metadata import TensorSpec
from carpool.contract.wire import BYTES, Tensor

# The number of labels is the loaded model's; the handler's `load` sets it.
LABELS = TensorSpec("labels", BYTES, (-1,))
SCORES = TensorSpec("scores", "FP32", (-1,))
# (scores, label indices) of each item, best first.
Ranked = tuple[torch.Tensor, torch.Tensor]


@dataclass(frozen=True, slots=True)
class Ranking:
    labels: Sequence[str]
    sigmoid: bool
    top_k: int

    @classmethod
    def of(
        cls, id2label: Mapping[Any, Any], problem_type: str | None, top_k: int | None
    ) -> Ranking:
        """The ranking a model's config asks for (transformers' `id2label`, whose keys
        may be strings, and `problem_type`), cut at `top_k`."""
        names = {int(index): str(label) for index, label in id2label.items()}
        if sorted(names) != list(range(len(names))):
            raise ValueError(f"id2label numbers {sorted(names)}, not 0 to {len(names) - 1}")
        count = len(names)
        multi_label = problem_type == "multi_label_classification"
        labels = [names[index] for index in range(count)]
        return cls(labels, multi_label or count == 1, min(top_k or count, count))

    def outputs(self) -> tuple[TensorSpec, TensorSpec]:
        k = (self.top_k,)
        return TensorSpec(LABELS.name, BYTES, k), TensorSpec(SCORES.name, "FP32", k)

    def rank(self, logits: torch.Tensor) -> Ranked:
        logits = logits.float()
        scores = logits.sigmoid() if self.sigmoid else logits.softmax(dim=-1)
        ranked = scores.topk(self.top_k, dim=-1)
        return ranked.values, ranked.indices

    def answers(self, ranked: Ranked) -> list[dict[str, Tensor]]:
        scores, indices = (tensor.cpu().numpy() for tensor in ranked)
        return [
            {
                LABELS.name: Tensor(BYTES, row.shape, [self.labels[i].encode() for i in row]),
                SCORES.name: Tensor.from_numpy(values),
            }
            for values, row in zip(scores, indices, strict=True)
        ]
