"""The v2 infer route, served before aiohttp's router and middleware chain.

Every request first meets `HotRoutes`: a POST whose path is plainly
`/v2/models/{name}[/versions/{version}]/infer` goes straight to `app.infer` through
`app.answered`, as the routed app would send it, without resolving the route, building the
middleware chain or sending the response-prepare signal. Anything else takes the app's own
path unchanged: every other route; paths with escapes, dot segments or braces, which the
router decodes or refuses; and a request that expects `100 Continue`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from aiohttp import hdrs, web

from carpool_sidecar import app
from carpool_sidecar.build import Front

RequestHandler = Callable[[web.BaseRequest], Awaitable[web.StreamResponse]]
# Characters that send a path to the router: escapes it decodes, braces its patterns
# refuse in a name, a fragment or the start of a query.
ROUTED_CHARACTERS = frozenset("%{}#?")


def infer_path(target: str) -> tuple[str, str | None] | None:
    """(model name, version or None) when the request target is plainly a v2 infer path."""
    path = target.partition("?")[0]
    if not path.startswith("/v2/models/") or not path.endswith("/infer"):
        return None
    middle = path[len("/v2/models/") : -len("/infer")].split("/")
    if len(middle) == 1:
        name, version = middle[0], None
    elif len(middle) == 3 and middle[1] == "versions":
        name, version = middle[0], middle[2]
    else:
        return None
    for segment in middle:
        if segment in ("", ".", "..") or not ROUTED_CHARACTERS.isdisjoint(segment):
            return None
    return name, version


class HotRoutes:
    """The server's request handler: the v2 infer route at once, the rest through the app."""

    __slots__ = ("_front", "_routed")

    def __init__(self, front: Front, routed: RequestHandler) -> None:
        self._front = front
        self._routed = routed

    def __call__(self, request: web.BaseRequest) -> Awaitable[web.StreamResponse]:
        front = self._front
        path = infer_path(request.raw_path) if request.method == hdrs.METH_POST else None
        if path is None or hdrs.EXPECT in request.headers:
            return self._routed(request)
        name, version = path
        return app.answered(request, app.infer(request, front, name, version), front, counted=True)


def serve_hot_routes(runner: web.AppRunner) -> None:
    """Once `runner` is set up (before any site starts): its server meets every request
    with `HotRoutes` over the app's own handler."""
    server = runner.server
    assert server is not None, "set the runner up first"
    server.request_handler = HotRoutes(runner.app[app.SIDECAR], server.request_handler)
