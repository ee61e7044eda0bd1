"""The Open Inference Protocol's generate extension, as the sidecar and a generation handler
share it: the tensor names of one prompt and its settings, and the default length."""

from __future__ import annotations

from typing import Final

TEXT_INPUT: Final = "text_input"
TEXT_OUTPUT: Final = "text_output"
MAX_NEW_TOKENS: Final = "max_new_tokens"
TEMPERATURE: Final = "temperature"
STOP: Final = "stop"
# Tokens generated when a request does not say; the sidecar fills it in, so that requests
# with and without the setting share a batch.
DEFAULT_MAX_NEW_TOKENS: Final = 32
