"""`text-classification`: a Hugging Face sequence classifier in `--model-path`, offline.

Each item is one text (`text`, BYTES [1], as text-embedding takes it, `text_batch`); each
answer is the model's labels and their scores, best first (`ranking`): every label, or
`--handler-options top_k=N`. `max_tokens` and `padding` are as for text-embedding.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from carpool.contract.metadata import Metadata
from carpool.contract.wire import Tensor
from carpool_model_server.handler import HandlerSettings
from carpool_model_server.handler_options import positive_option
from carpool_model_server.ranking import LABELS, SCORES, Ranked, Ranking
from carpool_model_server.text_batch import TEXT, TEXT_OPTIONS, TextHandler, Tokens


class TextClassificationHandler(TextHandler[Ranked]):
    metadata = Metadata(
        platform="pytorch_transformers",
        inputs=(TEXT,),
        outputs=(LABELS, SCORES),
        pads_variable_dims=True,
    )
    options = TEXT_OPTIONS | {"top_k"}

    def __init__(self, settings: HandlerSettings) -> None:
        super().__init__(settings)
        self.check_text_options()
        self._top_k = positive_option(settings.options, "top_k")

    def load(self, device: torch.device) -> None:
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        path = self.settings.model_path
        if path is None:
            raise ValueError("the text-classification handler needs --model-path")
        tokenizer: Any = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
        model = AutoModelForSequenceClassification.from_pretrained(str(path), local_files_only=True)
        self.model: Any = model.to(device=device, dtype=self.settings.dtype).eval()
        self.ranking = Ranking.of(model.config.id2label, model.config.problem_type, self._top_k)
        self.texts = self.text_batcher(path, tokenizer, model.config, device)
        if model.config.pad_token_id is None:
            # A decoder classifier finds each text's last token by it.
            model.config.pad_token_id = tokenizer.pad_token_id
        self.metadata = dataclasses.replace(self.metadata, outputs=self.ranking.outputs())

    def infer(self, batch: Tokens) -> Ranked:
        return self.ranking.rank(self.model(**batch.columns).logits)

    def postprocess(self, outputs: Ranked) -> list[dict[str, Tensor]]:
        return self.ranking.answers(outputs)
