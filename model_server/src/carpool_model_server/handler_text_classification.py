"""`text-classification`: a Hugging Face sequence classifier in `--model-path`, offline.

Each item is one text (`text`, BYTES [1], as text-embedding takes it, `text_batch`); each
answer is the model's labels and their scores, best first: `labels` BYTES [k] (the names
of the model's `id2label`) and `scores` FP32 [k]. The scores are the softmax of the logits,
or their sigmoid for a multi-label model (`problem_type: multi_label_classification`) or
one with a single output, as transformers' pipeline computes them. k is every label unless
`--handler-options top_k=N` asks for fewer; `max_tokens` and `padding` are as for
text-embedding.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from carpool.contract.metadata import Metadata, TensorSpec
from carpool.contract.wire import BYTES, Item, Tensor
from carpool_model_server.handler import Handler, HandlerSettings, Prepared, split_valid
from carpool_model_server.handler_options import choice_option, positive_option
from carpool_model_server.text_batch import (
    PADDINGS,
    TEXT,
    TextBatcher,
    Tokens,
    model_max_tokens,
    padding_for,
    text_item,
    text_of,
)

# The number of labels is the loaded model's; `load` sets it.
LABELS = TensorSpec("labels", BYTES, (-1,))
SCORES = TensorSpec("scores", "FP32", (-1,))
# (scores, label indices) of each item, best first.
Ranked = tuple[torch.Tensor, torch.Tensor]


class TextClassificationHandler(Handler[Tokens, Ranked]):
    preprocess_overlaps_infer = True  # the tokenizer serves preprocess alone
    metadata = Metadata(
        platform="pytorch_transformers",
        inputs=(TEXT,),
        outputs=(LABELS, SCORES),
        pads_variable_dims=True,
    )
    options = frozenset({"top_k", "padding", "max_tokens"})

    def __init__(self, settings: HandlerSettings) -> None:
        super().__init__(settings)
        choice_option(settings.options, "padding", PADDINGS)
        self._top_k = positive_option(settings.options, "top_k")
        self._max_tokens = positive_option(settings.options, "max_tokens")

    def load(self, device: torch.device) -> None:
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        path = self.settings.model_path
        if path is None:
            raise ValueError("the text-classification handler needs --model-path")
        tokenizer: Any = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
        model = AutoModelForSequenceClassification.from_pretrained(str(path), local_files_only=True)
        self.model: Any = model.to(device=device, dtype=self.settings.dtype).eval()
        config = model.config
        self.labels = [str(config.id2label[index]) for index in range(config.num_labels)]
        multi_label = config.problem_type == "multi_label_classification"
        self.sigmoid = multi_label or config.num_labels == 1
        self.top_k = min(self._top_k or config.num_labels, config.num_labels)
        longest = model_max_tokens(path, tokenizer, config)
        max_tokens = min(longest, self._max_tokens or longest)
        padding = padding_for(self.settings.options.get("padding"), device)
        self.texts = TextBatcher(tokenizer, max_tokens, device, padding)
        k = (self.top_k,)
        self.metadata = Metadata(
            platform=self.metadata.platform,
            inputs=self.metadata.inputs,
            outputs=(TensorSpec(LABELS.name, BYTES, k), TensorSpec(SCORES.name, "FP32", k)),
            pads_variable_dims=True,
        )

    def preprocess(self, items: Sequence[Item]) -> Prepared[Tokens]:
        texts, rejected = split_valid(items, text_of)
        if not texts:
            return Prepared(None, 0, rejected)
        return Prepared(self.texts.tokens(texts), len(texts), rejected)

    def infer(self, batch: Tokens) -> Ranked:
        logits = self.model(**batch.columns).logits.float()
        scores = logits.sigmoid() if self.sigmoid else logits.softmax(dim=-1)
        ranked = scores.topk(self.top_k, dim=-1)
        return ranked.values, ranked.indices

    def postprocess(self, outputs: Ranked) -> list[dict[str, Tensor]]:
        scores, indices = (tensor.cpu().numpy() for tensor in outputs)
        return [
            {
                LABELS.name: Tensor(BYTES, row.shape, [self.labels[i].encode() for i in row]),
                SCORES.name: Tensor.from_numpy(values),
            }
            for values, row in zip(scores, indices, strict=True)
        ]

    def example_item(self) -> Item:
        return text_item("carpool warms up the model.")

    def warmup_items(self) -> list[Item]:
        return self.texts.warmup_items()
