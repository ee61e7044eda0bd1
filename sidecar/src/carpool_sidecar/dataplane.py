"""The sidecar's logic between the HTTP routes and the batching engine.

Protocol-neutral: the v2 and v1 routes (and any other front end) hand it an InferRequest,
the generate route a GenerateRequest.
It checks a request against the model's metadata, cuts it into items, picks the batch
group (`batch_keys`) and deadline, awaits the results and stacks them back into whole tensors.
"""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncGenerator, Awaitable, Callable, Sequence
from typing import overload

import orjson

from carpool.contract.generation import TEXT_OUTPUT
from carpool.contract.metadata import ModelMetadata, TensorSpec
from carpool.contract.wire import BYTES, Item, ItemResult, Tensor
from carpool.engine.bounds import RequestBounds
from carpool.engine.errors import (
    BadModelResponse,
    BadRequest,
    ModelError,
    ModelNotFound,
    Unavailable,
)
from carpool_sidecar import generation
from carpool_sidecar.answers import AnswerBudget, answer_bytes, fixed_answer_bytes
from carpool_sidecar.batch_keys import batch_key
from carpool_sidecar.generation import Ending, GenerateRequest, GenerateResponse
from carpool_sidecar.health import ModelState
from carpool_sidecar.inference import MODEL_VERSION, InferRequest, InferResponse
from carpool_sidecar.item_batcher import ItemBatcher
from carpool_sidecar.streaming import Piece, Streams
from carpool_sidecar.tensors import RequestTensor, split, stack


class DataPlane:
    def __init__(
        self,
        model_name: str,
        batcher: ItemBatcher,
        state: ModelState,
        answers: AnswerBudget,
        streams: Streams | None = None,
        whole_generation: Callable[[float, Ending], None] | None = None,
    ) -> None:
        """`streams`: the way to a model server that batches generation itself; without
        it, generate requests always take the batcher. `whole_generation`: told of each
        generate answer that came whole from the batcher (its arrival, how it ended), for
        the generation metrics; by default `streams`' own."""
        self.model_name = model_name
        self.batcher = batcher
        self.state = state
        self.answers = answers
        self.streams = streams
        if whole_generation is None and streams is not None:
            whole_generation = streams.observe_whole
        self.whole_generation = whole_generation
        # Why the sidecar cannot serve any more (a background task died), else None.
        self.broken: str | None = None
        # SIGTERM came: not ready, and every answer closes its connection.
        self.stopping = False

    @property
    def live(self) -> bool:
        return self.broken is None

    @property
    def ready(self) -> bool:
        return self.live and self.state.ready and not self.stopping and not self.batcher.draining

    def stop_soon(self) -> None:
        """Turn not ready and close connections after their answers, still serving."""
        self.stopping = True

    def mark_broken(self, reason: str) -> None:
        """Stop serving for good: not live, not ready, every request 503."""
        self.broken = reason

    def check_model(self, name: str, version: str | None = None) -> None:
        if name != self.model_name:
            raise ModelNotFound(f"unknown model {name!r}; this sidecar serves {self.model_name!r}")
        if version is not None and version != MODEL_VERSION:
            raise ModelNotFound(
                f"unknown version {version!r} of model {name!r}; it has version {MODEL_VERSION!r}"
            )

    def metadata(self) -> ModelMetadata:
        metadata = self.state.metadata
        if self.broken is not None:
            raise Unavailable(f"the sidecar is broken: {self.broken}")
        if not self.state.ready or metadata is None:
            raise Unavailable("model server is not ready")
        return metadata

    def bounds(self) -> RequestBounds:
        """What one request may hold, for the codecs to check before converting its data."""
        return self.batcher.bounds

    def deadline(self, arrived_at: float, *timeouts_ms: float | None) -> float:
        """Loop time by which a request that arrived at `arrived_at` is answered: the
        shortest of the configured timeout and those the caller gave."""
        timeout_ms = self.batcher.settings.timeout_ms
        for value in timeouts_ms:
            if value is not None and value < timeout_ms:
                timeout_ms = value
        return arrived_at + timeout_ms / 1000

    async def infer(
        self,
        request: InferRequest,
        header_timeout_ms: float | None,
        arrived_at: float,
        answer_limit: int,
    ) -> InferResponse:
        """Answer `request`; its deadline counts from `arrived_at` (loop time), before the
        body was read and parsed. Its answer may take `answer_limit` bytes (the front's
        limit) and holds its room in the answer budget until the front releases it."""
        metadata = self.metadata()
        inputs = [_as_column(tensor, metadata) for tensor in request.inputs]
        output_names = _output_names(request, metadata)
        binary = _binary_outputs(request, output_names)
        # Outputs of fixed shape tell the answer's size before any work is done; the id it
        # echoes counts too.
        echoed = 0 if request.id is None else len(orjson.dumps(request.id))
        fixed = fixed_answer_bytes(metadata, output_names, binary, inputs[0].items)
        self.answers.check(echoed + fixed, answer_limit)
        deadline = self.deadline(arrived_at, request.timeout_ms, header_timeout_ms)
        results = await self._submit(inputs, metadata, deadline, request.priority, arrived_at)
        parts = {name: _output_of_items(name, results) for name in output_names}
        held = self.answers.hold(echoed + answer_bytes(parts, binary), answer_limit)
        try:
            outputs = [stack(name, parts[name]) for name in output_names]
        except BaseException:
            held.release()
            raise
        return InferResponse(self.model_name, request.id, outputs, binary, held)

    async def infer_stream(
        self,
        request: InferRequest,
        header_timeout_ms: float | None,
        arrived_at: float,
        answer_limit: int,
    ) -> AsyncGenerator[tuple[InferResponse, bool], None]:
        """`infer`, answered piece by piece where the model streams tokens and the request
        is one prompt: (response, whether it is the last). The pieces' `text_output` joined
        is the text; the last also holds the model's other outputs asked for."""
        metadata = self.metadata()
        inputs = [_as_column(tensor, metadata) for tensor in request.inputs]
        if not (metadata.streams_tokens and self.streams is not None and inputs[0].items == 1):
            response = await self.infer(request, header_timeout_ms, arrived_at, answer_limit)
            try:
                yield response, True
            finally:
                if response.held is not None:
                    response.held.release()
            return
        names = _output_names(request, metadata)
        deadline = self.deadline(arrived_at, request.timeout_ms, header_timeout_ms)
        pieces = self._streamed(
            inputs, metadata, request.priority, arrived_at, deadline, answer_limit
        )
        try:
            async for piece in pieces:
                outputs = [RequestTensor(TEXT_OUTPUT, BYTES, (1, 1), [piece.text.encode()])]
                if piece.final is not None:
                    outputs += generation.ending_tensors(piece.final.ending)
                shown = [tensor for tensor in outputs if tensor.name in names]
                binary = _binary_outputs(request, [tensor.name for tensor in shown])
                response = InferResponse(self.model_name, request.id, shown, binary)
                yield response, piece.final is not None
        finally:
            await pieces.aclose()

    async def generate(
        self,
        request: GenerateRequest,
        header_timeout_ms: float | None,
        arrived_at: float,
        answer_limit: int,
    ) -> GenerateResponse:
        """Generate text for one prompt, batched with other requests (/infer ones too) whose
        prompt length and max_new_tokens fall in the same buckets, or sent on its own to a
        model server that batches generation itself. The text is an answer as any: within
        `answer_limit`, its room held until the front releases it."""
        metadata = self.metadata()
        inputs = generation.model_inputs(request, metadata)
        deadline = self.deadline(arrived_at, request.timeout_ms, header_timeout_ms)
        streamed = metadata.streams_tokens and self.streams is not None
        if streamed:
            pieces = self._streamed(
                inputs, metadata, request.priority, arrived_at, deadline, answer_limit
            )
            text, ending = "", generation.Ending()
            async for piece in pieces:
                if piece.final is not None:
                    text, ending = piece.final.text_output, piece.final.ending
            output = Tensor(BYTES, (1,), [text.encode()])
        else:
            results = await self._submit(inputs, metadata, deadline, request.priority, arrived_at)
            (output,) = _output_of_items(TEXT_OUTPUT, results)
            ending = generation.ending_of(results[0].outputs or {})
            text = generation.text_of(output)
        held = self.answers.hold(answer_bytes({TEXT_OUTPUT: [output]}, frozenset()), answer_limit)
        if not streamed and self.whole_generation is not None:
            # Counted once its answer is sure to be sent, as the streamed path counts.
            self.whole_generation(arrived_at, ending)
        return GenerateResponse(self.model_name, text, ending, held)

    async def generate_stream(
        self,
        request: GenerateRequest,
        header_timeout_ms: float | None,
        arrived_at: float,
        answer_limit: int,
    ) -> AsyncGenerator[Piece, None]:
        """Generate text for one prompt, piece by piece as a model server that batches
        generation itself makes it; from any other, in one piece. The last piece carries
        the answer. Problems found before any work (a bad request, a full queue) raise
        before the first piece, so the front can still answer them with a status."""
        metadata = self.metadata()
        if not (metadata.streams_tokens and self.streams is not None):
            response = await self.generate(request, header_timeout_ms, arrived_at, answer_limit)
            try:
                yield Piece(response.text_output, response)
            finally:
                if response.held is not None:
                    response.held.release()
            return
        inputs = generation.model_inputs(request, metadata)
        deadline = self.deadline(arrived_at, request.timeout_ms, header_timeout_ms)
        pieces = self._streamed(
            inputs, metadata, request.priority, arrived_at, deadline, answer_limit
        )
        try:
            async for piece in pieces:
                yield piece
        finally:
            await pieces.aclose()

    def _streamed(
        self,
        inputs: Sequence[RequestTensor],
        metadata: ModelMetadata,
        priority: int,
        arrived_at: float,
        deadline: float,
        answer_limit: int,
    ) -> AsyncGenerator[Piece, None]:
        """The request as one stream frame, once it has a place in the running batch."""
        assert self.streams is not None
        if self.batcher.draining:  # as the batcher refuses new requests once it drains
            raise Unavailable("the sidecar is shutting down")
        item = RequestItems(inputs, _check_inputs(inputs, metadata))[0]
        limits = (metadata.max_batch_size, self.batcher.bounds.max_items, answer_limit)
        return self.streams.run(
            item, self.model_name, priority, limits, arrived_at, deadline, self.answers
        )

    def _submit(
        self,
        inputs: Sequence[RequestTensor],
        metadata: ModelMetadata,
        deadline: float,
        priority: int,
        arrived_at: float,
    ) -> Awaitable[Sequence[ItemResult]]:
        """Check the inputs, cut them into items: one result per item, to await. Not a
        coroutine itself, so its caller's await reaches the batcher's with one frame less."""
        items = RequestItems(inputs, _check_inputs(inputs, metadata))
        nbytes = sum(tensor.nbytes for tensor in inputs)
        key, lengths = batch_key(inputs, metadata)
        return self.batcher.submit(
            items,
            key,
            deadline,
            priority=priority,
            lengths=lengths,
            nbytes=nbytes,
            arrived_at=arrived_at,
        )


def _as_column(tensor: RequestTensor, metadata: ModelMetadata) -> RequestTensor:
    """Text shaped [n] for a model that takes [-1, 1], as [n, 1] (as KServe's and MLServer's
    text runtimes accept it)."""
    if tensor.datatype != BYTES or len(tensor.shape) != 1:
        return tensor
    spec = metadata.input(tensor.name)
    if spec is not None and spec.shape == (1,):
        return dataclasses.replace(tensor, shape=(tensor.items, 1))
    return tensor


def _check_inputs(inputs: Sequence[RequestTensor], metadata: ModelMetadata) -> int:
    """The request's item count, after checking its inputs against the model's."""
    given = {tensor.name for tensor in inputs}
    if len(given) != len(inputs):
        raise BadRequest("an input name appears twice")
    missing = [s.name for s in metadata.inputs if s.name not in given and not s.optional]
    if missing:
        raise BadRequest(f"missing inputs {missing}; the model takes {_names(metadata.inputs)}")
    count = inputs[0].items
    for tensor in inputs:
        spec = metadata.input(tensor.name)
        if spec is None:
            raise BadRequest(
                f"unknown input {tensor.name!r}; the model takes {_names(metadata.inputs)}"
            )
        if tensor.datatype != spec.datatype:
            raise BadRequest(
                f"input {tensor.name!r}: datatype {tensor.datatype}, "
                f"the model takes {spec.datatype}"
            )
        item_shape = tensor.shape[1:]
        # Equal shapes, the common case, need no look at each dimension.
        if item_shape != spec.shape and (
            len(item_shape) != len(spec.shape)
            or any(
                want not in (-1, have) for want, have in zip(spec.shape, item_shape, strict=True)
            )
        ):
            raise BadRequest(
                f"input {tensor.name!r}: shape {list(tensor.shape)}, the model takes "
                f"{[-1, *spec.shape]}"
            )
        if tensor.items != count:
            raise BadRequest(
                f"inputs disagree on the batch dimension: {inputs[0].name!r} has {count}, "
                f"{tensor.name!r} has {tensor.items}"
            )
        _check_limits(tensor, spec)
    return count


def _check_limits(tensor: RequestTensor, spec: TensorSpec) -> None:
    """The handler's per-item limits from the metadata, checked before anything is queued."""
    if (error := spec.limit_error(tensor.shape[1:], tensor.data)) is not None:
        raise BadRequest(error)


def _output_names(request: InferRequest, metadata: ModelMetadata) -> list[str]:
    if request.outputs is None:
        return [spec.name for spec in metadata.outputs]
    names: list[str] = []
    for output in request.outputs:
        if metadata.output(output.name) is None:
            raise BadRequest(
                f"unknown output {output.name!r}; the model gives {_names(metadata.outputs)}"
            )
        if output.name in names:
            # As Triton refuses it: each one would be answered, a copy each.
            raise BadRequest(f"output {output.name!r} already requested")
        names.append(output.name)
    return names


def _binary_outputs(request: InferRequest, output_names: list[str]) -> frozenset[str]:
    """An output's own `binary_data` wins over the request's `binary_data_output`."""
    if request.outputs is None:
        return frozenset(output_names) if request.binary_output else frozenset()
    return frozenset(
        output.name
        for output in request.outputs
        if (request.binary_output if output.binary is None else output.binary)
    )


def _names(specs: Sequence[TensorSpec]) -> list[str]:
    return [spec.name for spec in specs]


class RequestItems(Sequence[Item]):
    """A request's items, cut from its columns only when a batch takes them: the engine
    admits or refuses the request on its count and bytes alone, and an item that never
    reaches a batch (refused, expired, cancelled) costs no object."""

    def __init__(self, inputs: Sequence[RequestTensor], count: int) -> None:
        self._inputs = inputs
        self._count = count

    def __len__(self) -> int:
        return self._count

    @overload
    def __getitem__(self, index: int) -> Item: ...
    @overload
    def __getitem__(self, index: slice) -> list[Item]: ...
    def __getitem__(self, index: int | slice) -> Item | list[Item]:
        if isinstance(index, int):
            (item,) = self[index : index + 1 or None]
            return item
        start, stop, step = index.indices(self._count)
        if step != 1:
            raise ValueError("items are taken in runs")
        columns = [(tensor.name, split(tensor, start, stop)) for tensor in self._inputs]
        if len(columns) == 1:
            name, parts = columns[0]
            return [{name: part} for part in parts]
        return [{name: parts[n] for name, parts in columns} for n in range(stop - start)]


def _output_of_items(name: str, results: Sequence[ItemResult]) -> list[Tensor]:
    tensors = []
    for result in results:
        if result.error is not None:
            raise ModelError(result.error, _error_status(result.status))
        tensor = (result.outputs or {}).get(name)
        if tensor is None:
            raise BadModelResponse(f"model server result lacks output {name!r}")
        tensors.append(tensor)
    return tensors


def _error_status(status: int) -> int:
    """The model server's status for a failed item, if it is an error status; else 502."""
    return status if 400 <= status <= 599 else BadModelResponse.status
