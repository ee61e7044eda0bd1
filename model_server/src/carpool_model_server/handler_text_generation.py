"""`text-generation`: batched text generation with a Hugging Face causal language model.

`--model-path` names a folder holding the model and its tokenizer (`save_pretrained` output).
Prompts are left-padded so that every row's next token sits in the last column, and each
batch is split into power-of-two prompt-length buckets, one `model.generate` call each, so a
short prompt never pads to a long one. Settings are per item: a row stops at its own
`max_new_tokens`, end-of-sequence token or stop string, while the rest of its bucket goes on;
`temperature` 0 is greedy. With greedy decoding every prompt gets exactly the tokens it gets
when it runs alone; a sampled one with a `seed` gets the same text whatever its batch. Each
answer says why it ended (`finish_reason`, as the generate extension names the reasons) and
how many tokens its prompt and its answer took.

`--handler-options batching=continuous` runs requests sent one at a time (the generate
routes), greedy and sampled alike, through an iteration-level batching loop instead
(`continuous.TokenLoop`, transformers' continuous batching with a paged KV cache of
`cache_tokens` tokens, 16 sequences' worth of the context by default): requests join and
leave the running batch at every token, and the model server streams each one's tokens as
they come (`stream`). `scheduler` says what a step holds (`prefill_alone` by default: new
prompts in steps of their own) and `step_tokens` how many query tokens at most. A sampled
request draws the same tokens from its seed either way (`sampling`). Batches sent as
batches (`/infer`) keep the static way.

What one item may ask is bounded in the metadata, from the loaded model's context, so the
sidecar refuses the rest before queueing: the prompt's bytes (PROMPT_BYTES_PER_TOKEN per
token of context: tokenizing a longer one would only end in "too long", after holding the
worker), `max_new_tokens` (the context), the stop strings' count and length, and a
temperature the sampling computes with (any in [0, MAX_TEMPERATURE]: the logits are scaled
in float32 after subtracting their maximum, so even a subnormal temperature gives no NaN).
"""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncGenerator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
import torch

from carpool.contract import generation
from carpool.contract.metadata import Metadata, TensorSpec
from carpool.contract.wire import BYTES, Item, Tensor
from carpool_model_server import sampling
from carpool_model_server.errors import InvalidItem
from carpool_model_server.handler import (
    Handler,
    HandlerSettings,
    Prepared,
    check_limits,
    require_input,
    split_valid,
)
from carpool_model_server.streamed_text import CONTEXT_TOKENS, answer_text

# A prompt's bytes per token of the model's context: about 4 in English text, at most 4 per
# character in any UTF-8 text; 16 leaves room for odd texts while a prompt past it could
# only be refused after tokenizing it (a 16 MB prompt held the worker for 10 s and more).
PROMPT_BYTES_PER_TOKEN = 16
# The bound before the model is loaded, and for a model that states no context.
MAX_PROMPT_BYTES = 1 << 20
# Far above any useful temperature; any finite one would compute.
MAX_TEMPERATURE = 100.0
# Each row's stop strings are looked for after every token: their count and length bound it.
MAX_STOP_STRINGS = 16
MAX_STOP_BYTES = 256
_STOP_WINDOW = MAX_STOP_BYTES + 8  # tokens

TEXT_INPUT = TensorSpec(generation.TEXT_INPUT, BYTES, (1,), max_element_bytes=MAX_PROMPT_BYTES)
# The settings are optional: an item that leaves one out gets the generate extension's
# default (`generation.DEFAULT_MAX_TOKENS`, greedy, no stop strings, no seed).
MAX_NEW_TOKENS = TensorSpec(generation.MAX_NEW_TOKENS, "INT32", (1,), minimum=1, optional=True)
TEMPERATURE = TensorSpec(
    generation.TEMPERATURE, "FP32", (1,), minimum=0, maximum=MAX_TEMPERATURE, optional=True
)
# INT32: a seed is any whole number a client writes, and a float32 bound holds it.
SEED = TensorSpec(
    generation.SEED, "INT32", (1,), minimum=generation.NO_SEED, maximum=2**31 - 1, optional=True
)
STOP = TensorSpec(
    generation.STOP,
    BYTES,
    (-1,),
    max_elements=MAX_STOP_STRINGS,
    max_element_bytes=MAX_STOP_BYTES,
    optional=True,
)
TEXT_OUTPUT = TensorSpec(generation.TEXT_OUTPUT, BYTES, (1,))
FINISH_REASON = TensorSpec(generation.FINISH_REASON, BYTES, (1,))
PROMPT_TOKENS = TensorSpec(generation.PROMPT_TOKENS, "INT32", (1,))
GENERATED_TOKENS = TensorSpec(generation.GENERATED_TOKENS, "INT32", (1,))
WARMUP_PROMPT = "carpool warms up the model"
BATCHING = ("static", "continuous")
# How the token loop fills a step (continuous.StepSettings); the first is the default.
SCHEDULERS = ("prefill_alone", "fifo", "prefill_first")
# The paged cache holds this many sequences of the model's full context, by default.
CACHE_SEQUENCES = 16

if TYPE_CHECKING:
    from carpool_model_server.continuous import LoopState, Piece, TokenLoop


@dataclass(frozen=True, slots=True)
class Request:
    """One prompt, tokenized, with its own generation settings."""

    prompt_ids: list[int]
    max_new_tokens: int
    temperature: float  # 0: greedy
    stop: tuple[str, ...]
    seed: int | None = None  # of a sampled request's draws; None: any


@dataclass(frozen=True, slots=True)
class Answer:
    """One prompt's generated text, why it ended, and its token counts."""

    text: str
    finish_reason: str  # one of generation.FINISH_REASONS
    prompt_tokens: int
    generated_tokens: int

    def outputs(self) -> dict[str, Tensor]:
        return {
            TEXT_OUTPUT.name: Tensor(BYTES, (1,), [self.text.encode()]),
            FINISH_REASON.name: Tensor(BYTES, (1,), [self.finish_reason.encode()]),
            PROMPT_TOKENS.name: _count(self.prompt_tokens),
            GENERATED_TOKENS.name: _count(self.generated_tokens),
        }


@dataclass(frozen=True, slots=True)
class Bucket:
    """Prompts of similar length, left-padded into one tensor; `rows` are batch positions."""

    rows: list[int]
    requests: list[Request]
    input_ids: torch.Tensor
    attention_mask: torch.Tensor


@dataclass(frozen=True, slots=True)
class Prompts:
    buckets: list[Bucket]
    count: int

    def padding(self) -> tuple[int, int]:
        """(prompt tokens, token slots) over all buckets: how much of the batch is padding."""
        real = sum(int(bucket.attention_mask.sum()) for bucket in self.buckets)
        slots = sum(bucket.attention_mask.numel() for bucket in self.buckets)
        return real, slots


class TextGenerationHandler(Handler[Prompts, list[Answer]]):
    metadata = Metadata(
        platform="pytorch_transformers",
        inputs=(TEXT_INPUT, MAX_NEW_TOKENS, TEMPERATURE, STOP, SEED),
        outputs=(TEXT_OUTPUT, FINISH_REASON, PROMPT_TOKENS, GENERATED_TOKENS),
        pads_variable_dims=True,
    )
    options: ClassVar[frozenset[str]] = frozenset(
        {"batching", "cache_tokens", "step_tokens", "scheduler"}
    )

    def __init__(self, settings: HandlerSettings) -> None:
        super().__init__(settings)
        self.batching = settings.options.get("batching", "static")
        if self.batching not in BATCHING:
            raise ValueError(f"option batching={self.batching!r}: use one of {BATCHING}")
        self.cache_tokens = _tokens_option(settings.options, "cache_tokens")  # 0: the default
        scheduler = settings.options.get("scheduler", SCHEDULERS[0])
        if scheduler not in SCHEDULERS:
            raise ValueError(f"option scheduler={scheduler!r}: use one of {SCHEDULERS}")
        self.scheduler = scheduler
        self.step_tokens = _tokens_option(settings.options, "step_tokens")  # 0: the default
        self.loop: TokenLoop | None = None

    def load(self, device: torch.device) -> None:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        if self.settings.model_path is None:
            raise ValueError("the text-generation handler needs --model-path: a model folder")
        path = str(self.settings.model_path)
        self.device = device
        self.tokenizer: Any = AutoTokenizer.from_pretrained(path, local_files_only=True)
        model: Any = AutoModelForCausalLM.from_pretrained(path, local_files_only=True)
        self.model: Any = model.to(device=device, dtype=self.settings.dtype).eval()
        self.eos_id: int | None = self.tokenizer.eos_token_id
        self.eos_ids = end_tokens(self.eos_id, model.generation_config)
        pad_id = self.tokenizer.pad_token_id
        # GPT-2 style tokenizers have no pad token; padded slots are masked out anyway.
        self.pad_id: int = pad_id if pad_id is not None else (self.eos_id or 0)
        self.context = int(getattr(model.config, "max_position_embeddings", 0) or 1 << 30)
        self.metadata = _bounded(self.metadata, self.context)
        self.inputs = {spec.name: spec for spec in self.metadata.inputs}
        if self.batching == "continuous":
            self._start_loop()

    def _start_loop(self) -> None:
        from carpool_model_server.continuous import StepSettings, TokenLoop

        self.loop = TokenLoop(
            self.model,
            self.tokenizer,
            self.eos_ids,
            self.pad_id,
            max_sequences=self.settings.max_batch_size,
            cache_tokens=self.cache_tokens or CACHE_SEQUENCES * min(self.context, 1 << 16),
            step=StepSettings(self.step_tokens, self.scheduler),
        )
        self.loop.warm_up(self.tokenizer(WARMUP_PROMPT)["input_ids"], 4)
        self.metadata = dataclasses.replace(self.metadata, streams_tokens=True)

    def stream(self, item: Item) -> AsyncGenerator[Piece, None] | None:
        """The item's answer as it is generated, through the token loop; None without a
        loop (the static way). InvalidItem for an item it refuses."""
        request = self._request(item)
        if self.loop is None:
            return None
        tokens = len(request.prompt_ids) + request.max_new_tokens
        if tokens > self.loop.sequence_tokens():
            raise InvalidItem(
                f"prompt of {len(request.prompt_ids)} tokens plus {request.max_new_tokens} "
                f"new tokens exceeds the generation loop's KV cache of "
                f"{self.loop.sequence_tokens()} tokens (cache_tokens)"
            )
        return self.loop.generate(request)

    def loop_state(self) -> LoopState | None:
        return None if self.loop is None else self.loop.state()

    def close(self) -> None:
        """Stop the token loop's thread, if one runs."""
        if self.loop is not None:
            self.loop.stop()

    def preprocess(self, items: Sequence[Item]) -> Prepared[Prompts]:
        requests, rejected = split_valid(items, self._request)
        if not requests:
            return Prepared(None, 0, rejected)
        by_bucket: dict[int, list[int]] = {}
        for row, request in enumerate(requests):
            by_bucket.setdefault(_bucket(len(request.prompt_ids)), []).append(row)
        buckets = [self._pad([requests[r] for r in rows], rows) for rows in by_bucket.values()]
        return Prepared(Prompts(buckets, len(requests)), len(requests), rejected)

    def infer(self, batch: Prompts) -> list[Answer]:
        answers: list[Answer | None] = [None] * batch.count
        for bucket in batch.buckets:
            for row, answer in zip(bucket.rows, self._generate(bucket), strict=True):
                answers[row] = answer
        return [answer for answer in answers if answer is not None]

    def postprocess(self, outputs: list[Answer]) -> list[dict[str, Tensor]]:
        return [answer.outputs() for answer in outputs]

    def example_item(self) -> Item:
        return {TEXT_INPUT.name: Tensor(BYTES, (1,), [WARMUP_PROMPT.encode()])}

    def item_length(self, item: Item) -> int:
        """Prompt tokens, for sorting items offline (`carpool infer`); 0 for a bad item."""
        try:
            prompt = _string(require_input(item, self.inputs[TEXT_INPUT.name]), TEXT_INPUT.name)
        except InvalidItem:
            return 0
        return len(self.tokenizer(prompt)["input_ids"])

    def _request(self, item: Item) -> Request:
        # The cheap checks first: a refused item costs no tokenizing.
        prompt = _string(require_input(item, self.inputs[TEXT_INPUT.name]), TEXT_INPUT.name)
        max_new = int(self._setting(item, MAX_NEW_TOKENS, generation.DEFAULT_MAX_TOKENS))
        temperature = self._setting(item, TEMPERATURE, generation.DEFAULT_TEMPERATURE)
        seed = int(self._setting(item, SEED, generation.NO_SEED))
        stop: tuple[str, ...] = ()
        if STOP.name in item:
            tensor = item[STOP.name]
            if tensor.datatype != BYTES or len(tensor.shape) != 1:
                raise InvalidItem(f"input {STOP.name!r} must be a BYTES list of strings")
            check_limits(tensor, self.inputs[STOP.name])
            assert isinstance(tensor.data, list)
            stop = tuple(s for s in (_decode(b, STOP.name) for b in tensor.data) if s)
        prompt_ids: list[int] = self.tokenizer(prompt)["input_ids"]
        if not prompt_ids:
            raise InvalidItem(f"input {TEXT_INPUT.name!r} holds no tokens")
        if len(prompt_ids) + max_new > self.context:
            raise InvalidItem(
                f"prompt of {len(prompt_ids)} tokens plus {max_new} new tokens exceeds the "
                f"model's context of {self.context}"
            )
        return Request(prompt_ids, max_new, temperature, stop, None if seed < 0 else seed)

    def _setting(self, item: Item, spec: TensorSpec, default: float) -> float:
        """A one-number setting of the item, within its declared range, or the default."""
        tensor = item.get(spec.name)
        if tensor is None:
            return default
        if tensor.datatype == BYTES or tensor.element_count != 1:
            raise InvalidItem(f"input {spec.name!r} must hold one number, got {tensor.datatype}")
        check_limits(tensor, dataclasses.replace(self.inputs[spec.name], datatype=tensor.datatype))
        return float(tensor.to_numpy().reshape(-1)[0])

    def _pad(self, requests: list[Request], rows: list[int]) -> Bucket:
        width = max(len(request.prompt_ids) for request in requests)
        input_ids = torch.full((len(requests), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(requests), width), dtype=torch.long)
        for index, request in enumerate(requests):
            # Left padding: every row's last prompt token sits in the last column.
            input_ids[index, width - len(request.prompt_ids) :] = torch.tensor(request.prompt_ids)
            mask[index, width - len(request.prompt_ids) :] = 1
        return Bucket(rows, requests, input_ids.to(self.device), mask.to(self.device))

    def _generate(self, bucket: Bucket) -> list[Answer]:
        from transformers import GenerationConfig, LogitsProcessorList, StoppingCriteriaList

        requests = bucket.requests
        width = bucket.input_ids.shape[1]
        # Sampled rows draw their token in _RowSampling, each from its own generator, and
        # leave only it: `generate` itself decodes greedily.
        config = GenerationConfig(  # type: ignore[no-untyped-call]
            max_new_tokens=max(request.max_new_tokens for request in requests),
            do_sample=False,
            pad_token_id=self.pad_id,
            eos_token_id=self.eos_ids or None,
        )
        processors = LogitsProcessorList()
        if any(request.temperature > 0 for request in requests):
            processors.append(_RowSampling(requests, self.device))
        row_stop = _RowStop(requests, width, self.tokenizer, self.device)
        stopping = StoppingCriteriaList([row_stop])
        output = self.model.generate(
            input_ids=bucket.input_ids,
            attention_mask=bucket.attention_mask,
            generation_config=config,
            logits_processor=processors,
            stopping_criteria=stopping,
        )
        return [
            # A row its stop string ended gets padding while the others go on: not its own.
            self._finish(row_ids[width : width + row_stop.ended[row]].tolist(), request)
            for row, (row_ids, request) in enumerate(zip(output, requests, strict=True))
        ]

    def _finish(self, new_ids: list[int], request: Request) -> Answer:
        """The row's answer: its own token limit, end of sequence and first stop string
        applied, and which of them ended it."""
        return finish(self.tokenizer, self.eos_ids, new_ids, request)


def end_tokens(tokenizer_eos: int | None, config: Any) -> list[int]:
    """The tokens that end an answer: the tokenizer's end of sequence and those the model's
    generation config names, as the model's own `generate` stops at them (several, for
    Llama 3 and Qwen: the end of a turn beside the end of the text)."""
    named = getattr(config, "eos_token_id", None)
    ids = [tokenizer_eos, *(named if isinstance(named, list) else [named])]
    return list(dict.fromkeys(int(each) for each in ids if each is not None))


def finish(tokenizer: Any, eos_ids: list[int], new_ids: list[int], request: Request) -> Answer:
    """A prompt's answer from the tokens generated for it, however many past its end: its
    token limit, end of sequence and first stop string applied, and which of them ended it.
    A stop string ends the answer before the limit does; the end-of-sequence token is not
    counted in, nor shown. The text reads on from the prompt's (`answer_text`)."""
    new_ids = new_ids[: request.max_new_tokens]
    reason = generation.LENGTH
    ends = [new_ids.index(each) for each in eos_ids if each in new_ids]
    if ends:
        new_ids, reason = new_ids[: min(ends)], generation.EOS_TOKEN
    text = answer_text(tokenizer, request.prompt_ids, new_ids)
    cut = cut_at_stop(text, request.stop)
    if len(cut) < len(text):
        reason = generation.STOP_SEQUENCE
    return Answer(cut, reason, len(request.prompt_ids), len(new_ids))


class _RowSampling:
    """Leaves each row only its next token, chosen by `sampling.choose`: the argmax for a
    greedy row (0), a draw at the row's own temperature from the row's own generator
    otherwise, seeded with the request's seed. A seeded request so gets the same text
    whatever shares its batch."""

    def __init__(self, requests: list[Request], device: torch.device) -> None:
        temperatures = torch.tensor([r.temperature for r in requests], dtype=torch.float32)
        self.temperatures = temperatures.to(device)
        self.generators = {
            row: sampling.generator(request.seed, device)
            for row, request in enumerate(requests)
            if request.temperature > 0
        }

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        return sampling.only(scores, sampling.choose(scores, self.temperatures, self.generators))


class _RowStop:
    """Marks a row done at its own token limit or once its text holds one of its stop strings.

    Looked for after every token, so only in the row's last tokens: a stop string that
    completes now ends in the newest token, and each token is a byte of text at least, so it
    lies in the last MAX_STOP_BYTES tokens; a few more cover a character cut by the window's
    start. Earlier text was looked at before.
    """

    def __init__(
        self, requests: list[Request], width: int, tokenizer: Any, device: torch.device
    ) -> None:
        self.requests = requests
        self.width = width
        self.tokenizer = tokenizer
        self.limits = torch.tensor([r.max_new_tokens for r in requests], device=device)
        # Each row's tokens when a stop string ended it (its limit, else).
        self.ended = [r.max_new_tokens for r in requests]

    def __call__(self, input_ids: torch.Tensor, scores: Any, **_: Any) -> torch.Tensor:
        generated = input_ids.shape[1] - self.width
        done = generated >= self.limits
        for row, request in enumerate(self.requests):
            if request.stop and not done[row]:
                start = max(self.width, input_ids.shape[1] - _STOP_WINDOW)
                # Read on from the tokens before it, the prompt's at first, as `finish` does
                # (left padding: the row's prompt ends at `width`).
                before = max(start - CONTEXT_TOKENS, self.width - len(request.prompt_ids))
                ids = input_ids[row, before:].tolist()
                text = answer_text(self.tokenizer, ids[: start - before], ids[start - before :])
                done[row] = any(stop in text for stop in request.stop)
                if done[row]:
                    self.ended[row] = min(self.ended[row], generated)
        return done


def _tokens_option(options: Mapping[str, str], name: str) -> int:
    value = options.get(name, "0")
    if not value.isdecimal():  # not isdigit: int() refuses superscripts
        raise ValueError(f"option {name}={value!r}: use a whole number of tokens")
    return int(value)


def _bucket(length: int) -> int:
    """The power of two at or above `length`: prompts in one bucket pad at most to double."""
    return 1 << (length - 1).bit_length()


def _count(value: int) -> Tensor:
    return Tensor("INT32", (1,), np.array([value], dtype="<i4").tobytes())


def cut_at_stop(text: str, stop: tuple[str, ...]) -> str:
    cuts = [index for index in (text.find(s) for s in stop) if index >= 0]
    return text[: min(cuts)] if cuts else text


def _string(tensor: Tensor, name: str) -> str:
    assert isinstance(tensor.data, list)  # require_input checked it is BYTES
    return _decode(tensor.data[0], name)


def _decode(data: bytes, name: str) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise InvalidItem(f"input {name!r} is not UTF-8 text: {error}") from None


def _bounded(declared: Metadata, context: int) -> Metadata:
    """The metadata with the limits that follow from a model of `context` tokens."""
    prompt_bytes = min(MAX_PROMPT_BYTES, (context - 1) * PROMPT_BYTES_PER_TOKEN)

    def bounded(spec: TensorSpec) -> TensorSpec:
        if spec.name == TEXT_INPUT.name:
            return dataclasses.replace(spec, max_element_bytes=prompt_bytes)
        if spec.name == MAX_NEW_TOKENS.name:
            return dataclasses.replace(spec, maximum=context - 1)  # a prompt holds a token
        return spec

    return dataclasses.replace(declared, inputs=tuple(map(bounded, declared.inputs)))
