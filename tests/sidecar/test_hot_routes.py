"""Which request targets the v2 infer route takes ahead of aiohttp's router."""

from __future__ import annotations

import pytest

from carpool_sidecar.hot_routes import infer_path


@pytest.mark.parametrize(
    ("target", "path"),
    [
        ("/v2/models/toy/infer", ("toy", None)),
        ("/v2/models/toy/infer?trace=1", ("toy", None)),
        ("/v2/models/toy/versions/1/infer", ("toy", "1")),
        ("/v2/models/my-model.v2/infer", ("my-model.v2", None)),
    ],
)
def test_plain_infer_paths_are_taken_at_once(target: str, path: tuple[str, str | None]) -> None:
    assert infer_path(target) == path


@pytest.mark.parametrize(
    "target",
    [
        "/v2/models/t%6Fy/infer",  # an escape the router decodes
        "/v2/models/./infer",
        "/v2/models/../infer",
        "/v2/models//infer",
        "/v2/models/{toy}/infer",
        "/v2/models/toy/versions//infer",
        "/v2/models/toy/versions/1/2/infer",
        "/v2/models/toy/other/1/infer",
        "/v2/models/toy/infer/",
        "/v2/models/toy/generate",
        "http://example.com/v2/models/toy/infer",
        "/v2/models/toy#x/infer",
    ],
)
def test_anything_else_is_left_to_the_router(target: str) -> None:
    assert infer_path(target) is None
