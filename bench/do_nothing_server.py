"""Ingest ceilings: servers that read, gunzip and parse each body, then forget it.

* ``app``: bare ASGI parsing with orjson, the least any Python server must do.
* ``fastapi_app``: the web framework both measured servers use, with a gzip request
  middleware and a handler that reads the body as FastAPI applications usually do
  (``await request.json()``).
* ``fastapi_orjson_app``: the same, parsing the body with orjson instead.

The benchmark runs them with ``uvicorn bench.do_nothing_server:app`` (or ``:fastapi_app``).
"""

from __future__ import annotations

import gzip
from typing import Any

import orjson
from fastapi import FastAPI, Request

RECEIVED = orjson.dumps({"status": "received"})
HEADERS = [(b"content-type", b"application/json"), (b"content-length", str(len(RECEIVED)).encode())]


async def _read_body(receive: Any) -> bytes:
    chunks = []
    while True:
        message = await receive()
        chunks.append(message.get("body", b""))
        if not message.get("more_body"):
            return b"".join(chunks)


def _is_gzip(scope: dict[str, Any]) -> bool:
    return any(k == b"content-encoding" and b"gzip" in v for k, v in scope["headers"])


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] != "http":
        return
    body = await _read_body(receive)
    if _is_gzip(scope):
        body = gzip.decompress(body)
    if body:
        orjson.loads(body)
    await send({"type": "http.response.start", "status": 200, "headers": HEADERS})
    await send({"type": "http.response.body", "body": RECEIVED})


class _GunzipRequests:
    def __init__(self, inner: Any) -> None:
        self.inner = inner

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http" or not _is_gzip(scope):
            await self.inner(scope, receive, send)
            return
        body = gzip.decompress(await _read_body(receive))

        async def replay() -> dict[str, Any]:
            return {"type": "http.request", "body": body, "more_body": False}

        await self.inner(scope, replay, send)


fastapi_app = FastAPI()
fastapi_app.add_middleware(_GunzipRequests)


@fastapi_app.post("/{path:path}")
async def _parse_and_forget(request: Request) -> dict[str, str]:
    await request.json()
    return {"status": "received"}


@fastapi_app.get("/{path:path}")
async def _answer(request: Request) -> dict[str, str]:
    return {"status": "ok"}


fastapi_orjson_app = FastAPI()
fastapi_orjson_app.add_middleware(_GunzipRequests)


@fastapi_orjson_app.post("/{path:path}")
async def _parse_with_orjson_and_forget(request: Request) -> dict[str, str]:
    orjson.loads(await request.body())
    return {"status": "received"}


@fastapi_orjson_app.get("/{path:path}")
async def _answer_orjson(request: Request) -> dict[str, str]:
    return {"status": "ok"}
