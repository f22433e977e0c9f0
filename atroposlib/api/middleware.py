"""ASGI middleware of the trajectory API: bearer auth, request-body limits and the
declared body type.

All are plain ASGI (no per-request task or response buffering) because they sit on
the hot submission path.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
from typing import Any, Awaitable, Callable, Optional

import orjson
from starlette.middleware.gzip import GZipMiddleware

from atroposlib.api.errors import error_body
from atroposlib.api.group_checks import Problem
from atroposlib.api.journal import Journal, StorageFailed
from atroposlib.api.validation import InvalidGzip, PayloadTooLarge, gunzip_capped

log = logging.getLogger("atroposlib.api")
# Set in the scope of requests whose gzip body `BodyLimits` left compressed (see deferred paths).
GZIP_BODY_SCOPE_KEY = "atroposlib.gzip_body"
# Compressed bodies at least this large are gunzipped off the event loop (zlib releases the GIL).
GUNZIP_IN_THREAD_BYTES = 8 * 1024

Scope = dict[str, Any]
Message = dict[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


def replaying(message: Message, receive: Receive) -> Receive:
    """A `receive` that hands the app `message` (already read by a middleware) first, then reads on."""
    replayed = False

    async def replay() -> Message:
        nonlocal replayed
        if replayed:
            return await receive()
        replayed = True
        return message

    return replay


async def send_error(
    send: Send, status: int, code: str, message: str, extra_headers: Optional[list[tuple[bytes, bytes]]] = None
) -> None:
    body = orjson.dumps(error_body(code, message))
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers + (extra_headers or [])})
    await send({"type": "http.response.body", "body": body})


def _header(scope: Scope, name: bytes) -> Optional[bytes]:
    for key, value in scope.get("headers", ()):
        if key == name:
            return value
    return None


class BearerAuth:
    """Require ``Authorization: Bearer <key>`` everywhere except the public paths and
    the paths under the public prefixes."""

    def __init__(
        self, app: ASGIApp, api_key: str, public_paths: set[str], public_prefixes: tuple[str, ...] = ()
    ) -> None:
        self.app = app
        self.expected = f"Bearer {api_key}".encode()
        self.public_paths = public_paths
        self.public_prefixes = public_prefixes

    def _is_public(self, path: str) -> bool:
        return path in self.public_paths or (bool(self.public_prefixes) and path.startswith(self.public_prefixes))

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and not self._is_public(scope["path"]):
            supplied = _header(scope, b"authorization") or b""
            if not hmac.compare_digest(supplied, self.expected):
                await send_error(
                    send, 401, "unauthorized", "missing or wrong API key (Authorization: Bearer <key>)",
                    [(b"www-authenticate", b"Bearer")],
                )
                return
        await self.app(scope, receive, send)


class BodyLimits:
    """Read the whole request body under a cap, gunzip it if it is gzip-encoded (under a
    second cap), and hand the application the plain body.

    On `deferred_gzip_paths` a gzip body is passed on still compressed, with
    ``scope[GZIP_BODY_SCOPE_KEY] = True``: their handler decompresses it where it parses
    it (off the event loop) and stores the compressed bytes as they are.
    """

    def __init__(
        self, app: ASGIApp, max_body_bytes: int, max_decompressed_bytes: int,
        on_body: Optional[Callable[[str, int], None]] = None,
        deferred_gzip_paths: frozenset[str] = frozenset(),
    ) -> None:
        self.app = app
        self.max_body = max_body_bytes
        self.max_decompressed = max_decompressed_bytes
        self.on_body = on_body
        self.deferred_gzip_paths = deferred_gzip_paths

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = _header(scope, b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_body:
            await send_error(send, 413, "payload_too_large", f"request body exceeds {self.max_body} bytes")
            return
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_body:
                await send_error(send, 413, "payload_too_large", f"request body exceeds {self.max_body} bytes")
                return
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        if self.on_body is not None and body:
            self.on_body(scope["path"], len(body))
        encoding = (_header(scope, b"content-encoding") or b"").lower()
        headers = list(scope.get("headers", ()))
        scope = dict(scope)
        if b"gzip" in encoding and body and scope["path"] in self.deferred_gzip_paths:
            scope[GZIP_BODY_SCOPE_KEY] = True
        elif b"gzip" in encoding:
            if body:
                try:
                    if len(body) >= GUNZIP_IN_THREAD_BYTES:
                        body = await asyncio.to_thread(gunzip_capped, body, self.max_decompressed)
                    else:
                        body = gunzip_capped(body, self.max_decompressed)
                except PayloadTooLarge:
                    await send_error(
                        send, 413, "payload_too_large",
                        f"decompressed request body exceeds {self.max_decompressed} bytes",
                    )
                    return
                except InvalidGzip:
                    await send_error(send, 400, "invalid_gzip", "Invalid gzip payload")
                    return
            headers = [
                (k, v) for k, v in headers if k not in (b"content-encoding", b"content-length")
            ] + [(b"content-length", str(len(body)).encode())]
        scope["headers"] = headers
        await self.app(scope, replaying({"type": "http.request", "body": body, "more_body": False}, receive), send)


class DurableResponses:
    """Hold each response until every state change made before it is committed, so that
    an acknowledgement is never sent for something a crash could still lose."""

    def __init__(self, app: ASGIApp, journal: Callable[[], Journal]) -> None:
        self.app = app
        self.journal = journal

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        failed = False

        async def send_when_durable(message: Message) -> None:
            nonlocal failed
            if message["type"] == "http.response.start":
                try:
                    await self.journal().barrier()
                except StorageFailed as exc:
                    failed = True
                    await send_error(send, 503, "storage_error", f"the state journal failed: {exc}")
                    return
            if not failed:
                await send(message)

        await self.app(scope, receive, send_when_durable)


def is_json_media_type(content_type: bytes) -> bool:
    """``application/json`` or a ``+json`` type, parameters ignored."""
    media = content_type.split(b";", 1)[0].strip().lower()
    return media == b"application/json" or (media.startswith(b"application/") and media.endswith(b"+json"))


class JsonBodies:
    """Bodies are JSON whatever they are declared as; a body declared otherwise (or not
    at all) is refused with 415 under ``strict`` (reported to `on_refused`), accepted and
    reported to `on_accepted` under ``warn``. Sits inside `BodyLimits`, which hands on the
    whole body in one message."""

    def __init__(
        self, app: ASGIApp, level: str,
        on_accepted: Callable[[Problem], None], on_refused: Callable[[Problem], None],
    ) -> None:
        self.app = app
        self.level = level
        self.on_accepted = on_accepted
        self.on_refused = on_refused

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or self.level == "off":
            await self.app(scope, receive, send)
            return
        first = await receive()
        declared = _header(scope, b"content-type")
        if first.get("body") and (declared is None or not is_json_media_type(declared)):
            shown = declared.decode("latin-1") if declared is not None else "none"
            problem = Problem("content_type", "header.Content-Type", f"{shown} is not application/json")
            if self.level == "strict":
                self.on_refused(problem)
                await send_error(send, 415, "unsupported_media_type", f"{problem.text()}: send JSON bodies as application/json")
                return
            self.on_accepted(problem)
        await self.app(scope, replaying(first, receive), send)


class CompressedResponses:
    """Gzip responses (Starlette's `GZipMiddleware`) except on `small_response_paths`,
    whose answers are a few bytes: the submissions, where wrapping every response costs
    a measurable share of the server's time and never compresses anything."""

    def __init__(self, app: ASGIApp, small_response_paths: frozenset[str], minimum_size: int, compresslevel: int) -> None:
        self.app = app
        self.gzip = GZipMiddleware(app, minimum_size=minimum_size, compresslevel=compresslevel)
        self.small_response_paths = small_response_paths

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] in self.small_response_paths:
            await self.app(scope, receive, send)
        else:
            await self.gzip(scope, receive, send)
