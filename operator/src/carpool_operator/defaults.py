"""The operator's defaults for what a BatchedModel leaves out: images and batching settings.

The chart passes them as CARPOOL_DEFAULT_* variables; `carpool operator` and `carpool render`
also take them as --default-* flags. They are read once, at start, into one `Defaults`; a bad
value stops the program with an error that names the variable (or flag) and the value.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from carpool.contract.batching import KNOBS, Batching

# The images `make images` builds (Dockerfile), one per part; the chart's images.* name them too.
DEFAULT_IMAGE = "ghcr.io/carpool-dev/carpool-model-server:0.1.0"
# The same image built on CUDA torch (`make image-cuda`): what a model with resources.gpu > 0 gets.
DEFAULT_CUDA_IMAGE = "ghcr.io/carpool-dev/carpool-model-server:0.1.0-cu128"
# The sidecar's own image, without torch.
DEFAULT_SIDECAR_IMAGE = "ghcr.io/carpool-dev/carpool-sidecar:0.1.0"
# [registry[:port]/]path[:tag][@digest], lower-case path components (distribution's grammar).
_IMAGE = re.compile(
    r"^(?:(?:localhost|[a-zA-Z0-9-]+(?:\.[a-zA-Z0-9-]+)+)(?::[0-9]+)?/|[a-zA-Z0-9-]+:[0-9]+/)?"
    r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*(?:/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)*"
    r"(?::[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?(?:@sha256:[a-f0-9]{64})?$"
)
_INTEGER = re.compile(r"^[+-]?[0-9]+$")
# A RuntimeClass name is a DNS subdomain.
_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")

# Every setting by name; flag and variable names derive from it (see `flag`, `variable`).
NAMES = (
    "image",
    "cuda_image",
    "sidecar_image",
    "runtime_class_name",
    *(knob.attribute for knob in KNOBS),
)


def is_image(reference: str) -> bool:
    return bool(_IMAGE.match(reference))


class DefaultsError(ValueError):
    """A default that cannot be used; the message names where it came from and its value."""


@dataclass(frozen=True)
class Setting:
    """One setting as given: its source (a flag or variable name) and its text."""

    source: str
    text: str

    def fail(self, problem: str) -> DefaultsError:
        return DefaultsError(f"{self.source}={self.text!r}: {problem}")


@dataclass(frozen=True)
class Defaults:
    image: str = DEFAULT_IMAGE
    cuda_image: str = DEFAULT_CUDA_IMAGE
    sidecar_image: str = DEFAULT_SIDECAR_IMAGE  # empty: each model's own image
    runtime_class_name: str = ""  # of GPU pods; empty: the cluster's default runtime
    batching: Batching = field(default_factory=Batching)


def _image(setting: Setting, *, allow_empty: bool) -> str:
    text = setting.text.strip()
    if (allow_empty and not text) or is_image(text):
        return text
    raise setting.fail("not a valid image reference")


def _runtime_class(setting: Setting) -> str:
    text = setting.text.strip()
    if not text or (len(text) <= 253 and _SUBDOMAIN.match(text)):
        return text
    raise setting.fail("not a valid RuntimeClass name")


def _integer(setting: Setting, minimum: int, maximum: int) -> int:
    text = setting.text.strip()
    if _INTEGER.match(text) and minimum <= int(text) <= maximum:
        return int(text)
    raise setting.fail(f"must be an integer from {minimum} to {maximum}")


def _choice(setting: Setting, choices: tuple[str, ...]) -> str:
    text = setting.text.strip()
    if text in choices:
        return text
    raise setting.fail(f"must be one of {', '.join(choices)}")


def parse_defaults(given: Mapping[str, Setting]) -> Defaults:
    """The defaults with each given setting (keyed by a name of NAMES) checked and applied."""
    unknown = set(given) - set(NAMES)
    if unknown:
        raise ValueError(f"unknown default settings: {sorted(unknown)}")
    defaults = Defaults()
    batching: dict[str, int | str] = {}  # by batching.json key
    if "image" in given:
        defaults = replace(defaults, image=_image(given["image"], allow_empty=False))
    if "cuda_image" in given:
        defaults = replace(defaults, cuda_image=_image(given["cuda_image"], allow_empty=False))
    if "runtime_class_name" in given:
        defaults = replace(defaults, runtime_class_name=_runtime_class(given["runtime_class_name"]))
    if "sidecar_image" in given:
        sidecar_image = _image(given["sidecar_image"], allow_empty=True)
        defaults = replace(defaults, sidecar_image=sidecar_image)
    for knob in KNOBS:
        setting = given.get(knob.attribute)
        if setting is None:
            continue
        if knob.choices:
            batching[knob.key] = _choice(setting, knob.choices)
        else:
            batching[knob.key] = _integer(setting, knob.minimum, knob.maximum)
    return replace(defaults, batching=defaults.batching.overlay(batching))
