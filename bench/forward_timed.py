"""text-embedding with its forward pass's CPU time counted, for `bench/hop.py model-cpu`.

Served as `--handler forward_timed:ForwardTimedEmbedding` with bench/ on PYTHONPATH. With
torch threads 1 the forward pass runs on the worker thread alone, so that thread's CPU time
during `infer` is the forward pass's; the running total (seconds, a float64) is rewritten in
place at `$CARPOOL_FORWARD_CPU_FILE` after every batch, for the bench to subtract.
"""

from __future__ import annotations

import os
import struct
import time
from typing import TYPE_CHECKING

import torch

from carpool_model_server.handler import HandlerSettings
from carpool_model_server.handler_text_embedding import TextEmbeddingHandler

if TYPE_CHECKING:  # older checkouts, measured beside this one, keep it elsewhere
    from carpool_model_server.text_batch import Tokens

FILE_ENV = "CARPOOL_FORWARD_CPU_FILE"
TOTAL = struct.Struct("<d")


class ForwardTimedEmbedding(TextEmbeddingHandler):
    def __init__(self, settings: HandlerSettings) -> None:
        super().__init__(settings)
        self._total = 0.0
        self._file = os.open(os.environ[FILE_ENV], os.O_RDWR | os.O_CREAT, 0o600)

    def infer(self, batch: Tokens) -> torch.Tensor:
        started = time.thread_time()
        try:
            return super().infer(batch)
        finally:
            self._total += time.thread_time() - started
            os.pwrite(self._file, TOTAL.pack(self._total), 0)


def read_total(path: str) -> float:
    """The forward pass's CPU seconds so far (0 before the first batch)."""
    try:
        with open(path, "rb") as file:
            data = file.read(TOTAL.size)
    except FileNotFoundError:
        return 0.0
    return TOTAL.unpack(data)[0] if len(data) == TOTAL.size else 0.0
