"""The Open Inference Protocol's generate extension, as the sidecar and a generation handler
share it: the tensor names of one prompt, its settings and its answer, and the defaults.

The extension's request parameter is `max_tokens`; a model takes it as its input tensor
`max_new_tokens` (the name Hugging Face's `generate` uses, and carpool's before it followed
the extension), so that handlers and `/infer` clients written for it keep working.
"""

from __future__ import annotations

from typing import Final

TEXT_INPUT: Final = "text_input"
TEXT_OUTPUT: Final = "text_output"
MAX_TOKENS: Final = "max_tokens"
MAX_NEW_TOKENS: Final = "max_new_tokens"
TEMPERATURE: Final = "temperature"
STOP: Final = "stop"
SEED: Final = "seed"
# Optional outputs: why the answer ended (one of FINISH_REASONS) and its token counts.
FINISH_REASON: Final = "finish_reason"
PROMPT_TOKENS: Final = "prompt_tokens"
GENERATED_TOKENS: Final = "generated_tokens"
# The extension's reasons: the token limit, the model's end-of-sequence token, a stop string.
LENGTH: Final = "length"
EOS_TOKEN: Final = "eos_token"
STOP_SEQUENCE: Final = "stop_sequence"
FINISH_REASONS: Final = (LENGTH, EOS_TOKEN, STOP_SEQUENCE)
# The settings a request may give beside its text, each the model input of its own name but
# `max_tokens` (see `input_name`), whose deprecated name `max_new_tokens` is also taken.
SETTINGS: Final = (MAX_TOKENS, MAX_NEW_TOKENS, TEMPERATURE, SEED, STOP)
# What a request that leaves a setting out gets: the extension's default of 20 tokens,
# greedy decoding, no seed. The sidecar fills them in for /generate, so that requests with
# and without a setting share a batch; a model takes them for an /infer item that leaves
# its input out.
DEFAULT_MAX_TOKENS: Final = 20
DEFAULT_TEMPERATURE: Final = 0.0
NO_SEED: Final = -1
# Buckets (seconds) of the time-to-first-token and between-tokens histograms, the sidecar's
# and the model server's alike, so that the two sides' quantiles compare.
FIRST_TOKEN_BUCKETS: Final = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
TOKEN_GAP_BUCKETS: Final = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


def input_name(setting: str) -> str:
    """The model input that takes a request's setting of this name."""
    return MAX_NEW_TOKENS if setting == MAX_TOKENS else setting


def setting_name(input_name: str) -> str:
    """The name a request gives the setting that goes to this model input."""
    return MAX_TOKENS if input_name == MAX_NEW_TOKENS else input_name
