"""The MLServer runtime that serves carpool's model: one batch of items per predict call.

MLServer's adaptive batching merges the requests that arrive within `max_batch_time` (up
to `max_batch_size` of them) into one request along the first dimension before `predict`
sees it, and splits the response back; the runtime decodes the merged input tensors into
carpool items and runs them through carpool's handler as one batch.
"""

from __future__ import annotations

from typing import Any

import peer_model
from mlserver import MLModel
from mlserver.types import Datatype, InferenceRequest, InferenceResponse, ResponseOutput


class CarpoolModel(MLModel):  # type: ignore[misc]
    async def load(self) -> bool:
        extra: dict[str, Any] = self.settings.parameters.extra
        self.handler = peer_model.load(
            extra["handler"],
            extra["device"],
            extra["torch_threads"],
            self.settings.max_batch_size,
            extra["dtype"],
        )
        return True

    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        inputs = [
            {
                "name": tensor.name,
                "datatype": Datatype(tensor.datatype).value,
                "shape": tensor.shape,
                "data": getattr(tensor.data, "root", tensor.data),
            }
            for tensor in payload.inputs
        ]
        results = peer_model.run(self.handler, peer_model.items(inputs))
        return InferenceResponse(
            model_name=self.name,
            id=payload.id,
            outputs=[ResponseOutput(**output) for output in peer_model.outputs(results)],
        )
