import asyncio
import logging

import aiohttp
import httpx
import pytest
from aiohttp import web

from atroposlib.utils.io import parse_http_response


def _handler(request: httpx.Request) -> httpx.Response:
    if request.url.path == "/ok":
        return httpx.Response(200, json={"a": 1})
    if request.url.path == "/text":
        return httpx.Response(200, text="not json")
    return httpx.Response(503, text="overloaded")


def test_httpx_responses(caplog: pytest.LogCaptureFixture) -> None:
    async def scenario() -> None:
        async with httpx.AsyncClient(transport=httpx.MockTransport(_handler), base_url="http://t") as client:
            assert await parse_http_response(await client.get("/ok")) == {"a": 1}
            with pytest.raises(httpx.HTTPStatusError):
                await parse_http_response(await client.get("/busy"), logging.getLogger("mine"))
            with pytest.raises(ValueError):
                await parse_http_response(await client.get("/text"))

    asyncio.run(scenario())
    assert "503" in caplog.text and "overloaded" in caplog.text and "not json" in caplog.text


async def _ok(request: web.Request) -> web.Response:
    return web.json_response({"a": 1})


async def _busy(request: web.Request) -> web.Response:
    return web.Response(status=503, text="overloaded")


def test_aiohttp_responses(caplog: pytest.LogCaptureFixture) -> None:
    async def scenario() -> None:
        app = web.Application()
        app.router.add_get("/ok", _ok)
        app.router.add_get("/busy", _busy)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = runner.addresses[0][1]
        try:
            async with aiohttp.ClientSession() as session:
                async with session.get(f"http://127.0.0.1:{port}/ok") as resp:
                    assert await parse_http_response(resp) == {"a": 1}
                async with session.get(f"http://127.0.0.1:{port}/busy") as resp:
                    with pytest.raises(aiohttp.ClientResponseError):
                        await parse_http_response(resp)
        finally:
            await runner.cleanup()

    asyncio.run(scenario())
    assert "overloaded" in caplog.text
