"""The dashboard's web app: a JSON API under ``/api/``, a live event stream per training, and two pages.

Every request reads the home afresh (no cache, no second store); a training's stream polls the database on
the server, so the browser never reads files. ``create_app`` holds all the app needs; there is no global state.
"""

from __future__ import annotations

import asyncio
import hmac
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

from eth_account import Account
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp, Receive, Scope, Send

from aitbc_agent_sdk.errors import AitbcError, NotFoundError, UnsafeNameError

from . import state

STATIC = Path(__file__).parent / "static"
POLL_INTERVAL_S = 1.0
# The pages load only their own script and style, and nothing from elsewhere.
SECURITY_HEADERS = [(b"content-security-policy", b"default-src 'self'; img-src 'self' data:; frame-ancestors 'none'"),
                    (b"x-content-type-options", b"nosniff"), (b"referrer-policy", b"no-referrer")]

MarketReader = Callable[[], Awaitable[list[dict[str, Any]]]]


class TokenGate:
    """ASGI middleware: every request but the static files needs the token, as ``?token=`` or a bearer header."""

    def __init__(self, app: ASGIApp, token: str | None) -> None:
        self.app, self.token = app, token

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            async def secured(message: dict[str, Any]) -> None:
                if message["type"] == "http.response.start":
                    message = {**message, "headers": [*message.get("headers", []), *SECURITY_HEADERS]}
                await send(message)

            if self.token is not None and not scope["path"].startswith("/static/") and not self._allowed(scope):
                await JSONResponse({"error": "a token is required: add ?token=... or 'Authorization: Bearer ...'"},
                                   status_code=401, headers={"www-authenticate": "Bearer"})(scope, receive, secured)
                return
            await self.app(scope, receive, secured)
            return
        await self.app(scope, receive, send)

    def _allowed(self, scope: Scope) -> bool:
        assert self.token is not None
        request = Request(scope)
        given = request.query_params.get("token")
        header = request.headers.get("authorization", "")
        if header.lower().startswith("bearer "):
            given = header[7:].strip()
        return given is not None and hmac.compare_digest(given.encode(), self.token.encode())


def error(message: str, status: int) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status)


def _api_error(exc: AitbcError) -> JSONResponse:
    if isinstance(exc, (NotFoundError, UnsafeNameError)):  # a malformed id is no training either
        return error(str(exc), 404)
    return error(f"{type(exc).__name__}: {exc}", 500)


def create_app(home: Path, *, token: str | None = None, allowed_hosts: list[str] | None = None,
               market: MarketReader | None = None, network: str = "devnet",
               interval: float = POLL_INTERVAL_S) -> Starlette:
    """The dashboard of HOME. TOKEN: required on every request but the static files. ALLOWED_HOSTS: the Host
    headers answered (the loopback names when bound to loopback, so a rebound DNS name cannot read it).
    MARKET: how the market is read (default: discovery on NETWORK with a throwaway key)."""
    reader = Account.create()  # the market's reader for this dashboard's life (state.market_offers)
    read_market = market or (lambda: state.market_offers(home, network, reader))

    async def trainings(request: Request) -> Response:
        try:
            return JSONResponse({"trainings": await state.training_rows(home)})
        except AitbcError as exc:
            return _api_error(exc)

    async def training(request: Request) -> Response:
        try:
            return JSONResponse(await state.training_view(home, request.path_params["training_id"]))
        except AitbcError as exc:
            return _api_error(exc)

    async def events(request: Request) -> Response:
        from sse_starlette import EventSourceResponse

        training_id = request.path_params["training_id"]
        try:
            first = await state.training_view(home, training_id)  # 404 before the stream starts
        except AitbcError as exc:
            return _api_error(exc)
        return EventSourceResponse(_snapshots(home, training_id, first, request, interval), ping=15)

    async def market_view(request: Request) -> Response:
        try:
            return JSONResponse({"offers": await read_market()})
        except state.MarketUnavailable as exc:
            return error(str(exc), 503)

    async def index(request: Request) -> Response:
        return FileResponse(STATIC / "index.html")

    async def training_page(request: Request) -> Response:
        try:
            await state.read_snapshot(home, request.path_params["training_id"])
        except AitbcError as exc:
            return Response(f"404: {exc}", status_code=404, media_type="text/plain")
        return FileResponse(STATIC / "training.html")

    routes = [
        Route("/", index), Route("/trainings/{training_id}", training_page),
        Route("/trainings/{training_id}/workers/{worker}", training_page),
        Route("/api/trainings", trainings), Route("/api/trainings/{training_id}", training),
        Route("/api/trainings/{training_id}/events", events), Route("/api/market", market_view),
        Mount("/static", StaticFiles(directory=STATIC), name="static"),
    ]
    middleware = [Middleware(TokenGate, token=token)]
    if allowed_hosts is not None:
        middleware.insert(0, Middleware(TrustedHostMiddleware, allowed_hosts=allowed_hosts))
    return Starlette(routes=routes, middleware=middleware, exception_handlers={404: _not_found})


async def _not_found(request: Request, exc: Exception) -> Response:
    """No route (an id with a '/' in it lands here too): a JSON message, as for an unknown training."""
    return error(f"nothing at {request.url.path}", 404)


async def _snapshots(home: Path, training_id: str, first: dict[str, Any], request: Request,
                     interval: float) -> AsyncIterator[dict[str, str]]:
    """The training's view each time it changes, read on the server every INTERVAL seconds; the last one when
    it has finished, then the stream ends (so does it when the client goes)."""
    view, sent = first, ""
    while True:
        text = json.dumps(view, sort_keys=True)
        if text != sent:
            yield {"event": "snapshot", "data": text}
            sent = text
        if view["finished"] or await request.is_disconnected():
            return
        await asyncio.sleep(interval)
        try:
            view = await state.training_view(home, training_id)
        except AitbcError as exc:  # the log broke mid-run: say so once, and stop
            yield {"event": "error", "data": json.dumps({"error": str(exc)})}
            return
