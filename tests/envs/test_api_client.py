"""The env's API client never loses a group: spool on outage, rejected log on 4xx."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import httpx

from atroposlib.api import ApiSettings, create_app
from atroposlib.envs.api_client import TrajectoryApiClient, encode_body
from tests.conftest import group, registration


class Outage(httpx.AsyncBaseTransport):
    """A transport that fails while `down` is set, else forwards to the app."""

    def __init__(self, inner: httpx.AsyncBaseTransport) -> None:
        self.inner, self.down = inner, False

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if self.down:
            raise httpx.ConnectError("down", request=request)
        return await self.inner.handle_async_request(request)


def test_spool_rejected_log_and_ordered_replay(tmp_path: Path) -> None:
    async def scenario() -> tuple[list[float], dict, int]:
        app = create_app(ApiSettings(ephemeral=True, validation_workers=0))
        async with app.router.lifespan_context(app):
            transport = Outage(httpx.ASGITransport(app=app))
            client = TrajectoryApiClient("http://api", tmp_path / "spool")
            client.http = httpx.AsyncClient(transport=transport, base_url="http://api")
            await client.post_json("/register", registration(4))
            assert await client.submit("/scored_data", group(4, score=1, submission_id="a"))
            transport.down = True
            assert not await client.submit("/scored_data", group(4, score=2, submission_id="b"))
            transport.down = False
            assert not await client.submit("/scored_data", {"tokens": [[1]], "masks": [], "scores": [1.0]})
            assert await client.submit("/scored_data", group(4, score=3, submission_id="c"))
            rejected = json.loads((tmp_path / "spool" / "rejected.jsonl").read_text())
            scores = []
            while (batch := (await client.get_json("/batch"))["batch"]):
                scores += [g["scores"][0] for g in batch]
            resent = client.items_resent
            await client.close()
            return scores, rejected, resent

    scores, rejected, resent = asyncio.run(scenario())
    assert scores == [1.0, 2.0, 3.0]
    assert rejected["status"] == 422 and rejected["payload"]["tokens"] == [[1]]
    assert resent == 1


def test_bodies_are_gzipped_only_when_it_helps() -> None:
    small, headers = encode_body({"a": 1})
    assert "Content-Encoding" not in headers and small == b'{"a":1}'
    large, headers = encode_body(group(8, length=200))
    assert headers["Content-Encoding"] == "gzip" and large[:2] == b"\x1f\x8b"


class Hanging(httpx.AsyncBaseTransport):
    """An API that never answers (a stuck host)."""

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        await asyncio.sleep(3600)
        raise AssertionError("unreachable")


def test_a_delivery_cancelled_by_a_stop_is_spooled(tmp_path: Path) -> None:
    async def scenario() -> None:
        client = TrajectoryApiClient("http://api", tmp_path / "spool")
        client.http = httpx.AsyncClient(transport=Hanging(), base_url="http://api")
        sending = asyncio.create_task(client.submit("/scored_data", group(4, submission_id="s")))
        await asyncio.sleep(0.1)
        sending.cancel()
        await asyncio.gather(sending, return_exceptions=True)
        await client.close()

    asyncio.run(scenario())
    ((_, endpoint, body),) = TrajectoryApiClient("http://api", tmp_path / "spool").spool.pending()
    assert endpoint == "/scored_data" and json.loads(body)["submission_id"] == "s"


def test_draining_the_spool_keeps_its_deadline_when_the_api_hangs(tmp_path: Path) -> None:
    async def scenario() -> tuple[bool, float]:
        client = TrajectoryApiClient("http://api", tmp_path / "spool")
        client.spool.append("/scored_data", json.dumps(group(4, submission_id="s")).encode())
        client.http = httpx.AsyncClient(transport=Hanging(), base_url="http://api")
        started = asyncio.get_running_loop().time()
        drained = await client.drain_spool(deadline_s=0.5)
        elapsed = asyncio.get_running_loop().time() - started
        await client.close()
        return drained, elapsed

    drained, elapsed = asyncio.run(scenario())
    assert not drained and elapsed < 5
    ((_, endpoint, body),) = TrajectoryApiClient("http://api", tmp_path / "spool").spool.pending()
    assert json.loads(body)["submission_id"] == "s"


def test_a_refused_key_stops_the_wait_and_spools_groups_until_the_key_is_right(tmp_path: Path) -> None:
    import pytest

    from atroposlib.envs.api_client import ApiKeyRefused

    async def scenario() -> list[float]:
        app = create_app(ApiSettings(ephemeral=True, validation_workers=0, api_key="right"))
        async with app.router.lifespan_context(app):
            def client_with(key: str) -> TrajectoryApiClient:
                client = TrajectoryApiClient("http://api", tmp_path / "spool")
                client.http = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://api",
                                                headers={"Authorization": f"Bearer {key}"})
                return client

            wrong, right = client_with("wrong"), client_with("right")
            with pytest.raises(ApiKeyRefused, match="refuses this process's key .HTTP 401.: set ATROPOS_API_KEY"):
                await wrong.wait_for_trainer(poll_s=0.01)
            await right.post_json("/register", registration(4))
            assert not await wrong.submit("/scored_data", group(4, score=1, submission_id="a"))
            assert not (tmp_path / "spool" / "rejected.jsonl").exists() and len(wrong.spool) == 1
            assert await right.submit("/scored_data", group(4, score=2, submission_id="b"))  # re-sends "a" first
            scores = []
            while (batch := (await right.get_json("/batch"))["batch"]):
                scores += [g["scores"][0] for g in batch]
            await wrong.close()
            await right.close()
            return scores

    assert asyncio.run(scenario()) == [1.0, 2.0]
