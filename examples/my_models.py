"""A model of your own for carpool: a handler class, served as `my_models:Scaler`."""

from collections.abc import Sequence

import numpy as np
import torch

from carpool.contract.metadata import Metadata, TensorSpec
from carpool.contract.wire import Item, Tensor
from carpool_model_server.handler import Handler, Prepared, require_input, split_valid

FEATURES = TensorSpec("features", "FP32", (4,))  # each item: four floats
SCORE = TensorSpec("score", "FP32", (1,))


class Scaler(Handler[torch.Tensor, torch.Tensor]):
    """A linear layer: the whole batch goes through it in one forward pass."""

    metadata = Metadata(platform="pytorch", inputs=(FEATURES,), outputs=(SCORE,))

    def load(self, device: torch.device) -> None:
        # Your weights would come from self.settings.model_path; these are fixed: 1, 2, 3, 4.
        self.device = device
        self.layer = torch.nn.Linear(4, 1, bias=False).to(device, self.settings.dtype)
        with torch.no_grad():
            self.layer.weight.copy_(torch.tensor([[1.0, 2.0, 3.0, 4.0]]))

    def preprocess(self, items: Sequence[Item]) -> Prepared[torch.Tensor]:
        # A malformed item is refused alone (400 to its caller); the rest of the batch runs.
        rows, rejected = split_valid(items, lambda item: require_input(item, FEATURES))
        if not rows:
            return Prepared(None, 0, rejected)
        batch = torch.from_numpy(np.stack([row.to_numpy() for row in rows]))
        return Prepared(batch.to(self.device, self.settings.dtype), len(rows), rejected)

    def infer(self, batch: torch.Tensor) -> torch.Tensor:
        return self.layer(batch)

    def postprocess(self, outputs: torch.Tensor) -> list[dict[str, Tensor]]:
        return [{"score": Tensor.from_numpy(row)} for row in outputs.float().cpu().numpy()]

    def example_item(self) -> Item:
        # Warm-up runs batches of this item before the server says ready.
        return {"features": Tensor.from_numpy(np.zeros(4, dtype=np.float32))}
