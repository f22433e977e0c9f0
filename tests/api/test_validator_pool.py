"""Large submissions are checked in worker processes with the same results as inline."""

from __future__ import annotations

import asyncio
import gzip
import os
import random
import signal
import subprocess
import sys
from typing import Any, Callable

import orjson
import pytest
from fastapi.testclient import TestClient

from atroposlib.api import validator_pool
from atroposlib.api.validation import BodyInvalid
from atroposlib.api.validator_pool import POOL_MIN_BYTES, ValidatorPool
from tests.conftest import group, start_run

GZIP = {"Content-Encoding": "gzip", "Content-Type": "application/json"}


def big_group(score: float = 1.0, **extra) -> dict:
    """A group whose gzip body is still large enough for the pool (random token ids)."""
    rng = random.Random(score)
    tokens = [[rng.randrange(100, 32000) for _ in range(1200)] for _ in range(8)]
    body = group(8, env_id=0, score=score, **extra)
    body["tokens"], body["masks"] = tokens, [[-100] * 100 + t[100:] for t in tokens]
    assert len(gzip.compress(orjson.dumps(body))) > POOL_MIN_BYTES
    return body


def pooled_client(make_client: Callable[..., TestClient], **settings: Any) -> TestClient:
    """A server whose validator worker (started by the first large body) is ready."""
    client = make_client(validation_workers=1, **settings)
    pool = client.app.state.runtime().validators

    async def workers_ready() -> None:
        pool._pick_worker()  # starts the missing workers, as a large body would
        while not all(worker.ready for worker in pool._workers):
            await asyncio.sleep(0.02)

    client.portal.call(asyncio.wait_for, workers_ready(), 30)
    return client


@pytest.fixture
def pooled(make_client: Callable[..., TestClient]) -> TestClient:
    client = pooled_client(make_client)
    start_run(client, 8)
    return client


def test_large_groups_go_through_workers_and_are_served_canonically(pooled, monkeypatch) -> None:
    def inline(*args: object) -> None:
        raise AssertionError("a large body was checked in the server process")

    monkeypatch.setattr(validator_pool, "inspect_group_body", inline)
    submitted = big_group(score=3, unknown="dropped")
    assert pooled.post("/scored_data", content=gzip.compress(orjson.dumps(submitted)), headers=GZIP).json() == {"status": "received"}
    assert pooled.post("/scored_data", json=big_group(score=4)).json() == {"status": "received"}
    first, second = (pooled.get("/batch").json()["batch"][0] for _ in range(2))
    assert first["scores"][0] == 3.0 and "unknown" not in first and first["tokens"] == submitted["tokens"]
    assert second["scores"][0] == 4.0
    runtime = pooled.app.state.runtime()
    assert len(runtime.validators.live_workers()) == 1


def test_worker_reports_invalid_groups_by_field(pooled) -> None:
    bad = big_group()
    bad["masks"] = bad["masks"][:-1]
    response = pooled.post("/scored_data", content=gzip.compress(orjson.dumps(bad)), headers=GZIP)
    assert response.status_code == 422 and "body.masks" in response.json()["error"]["message"]
    bad = big_group()
    bad["scores"] = "x"
    response = pooled.post("/scored_data", json=bad)
    assert response.status_code == 422 and response.json()["detail"][0]["loc"] == ["body", "scores"]


def test_worker_reports_corrupt_gzip(pooled) -> None:
    corrupt = gzip.compress(orjson.dumps(big_group()))[:-40] + b"\x00" * 40
    response = pooled.post("/scored_data", content=corrupt, headers=GZIP)
    assert response.status_code == 400 and response.json()["error"]["code"] == "invalid_gzip"


def test_worker_enforces_the_decompression_cap(make_client) -> None:
    client = pooled_client(make_client, max_decompressed_bytes=100_000)
    start_run(client, 8)
    bomb = gzip.compress(b"[" + b"0," * 12_000_000 + b"0]")
    assert len(bomb) > POOL_MIN_BYTES
    response = client.post("/scored_data", content=bomb, headers=GZIP)
    assert response.status_code == 413 and response.json()["error"]["code"] == "payload_too_large"


def test_a_dead_worker_is_replaced_without_failing_requests(pooled) -> None:
    assert pooled.post("/scored_data", json=big_group(score=1)).status_code == 200
    runtime = pooled.app.state.runtime()
    for pid in runtime.validators.live_workers():
        os.kill(pid, signal.SIGKILL)
    assert pooled.post("/scored_data", json=big_group(score=2)).json() == {"status": "received"}
    assert pooled.post("/scored_data", json=big_group(score=3)).json() == {"status": "received"}
    assert len(runtime.validators.live_workers()) == 1
    assert pooled.get("/status").json()["queue_size"] == 3


@pytest.mark.parametrize("cpus, workers", [(1, 0), (2, 2), (3, 3), (4, 4), (16, 4)])
def test_the_default_is_one_worker_per_cpu(cpus: int, workers: int, monkeypatch: pytest.MonkeyPatch) -> None:
    from atroposlib.api.settings import ApiSettings

    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(cpus)), raising=False)
    assert ApiSettings().resolved_validation_workers() == workers
    assert ApiSettings(validation_workers=3).resolved_validation_workers() == 3


def test_bodies_arriving_while_the_worker_starts_are_checked_inline() -> None:
    pool = ValidatorPool(1, "warn", 1 << 30)
    body = orjson.dumps(big_group(score=7))

    async def first_submission() -> tuple[int, bool]:
        submission = await pool.inspect(body, gzipped=False)
        return submission.size, pool._workers[0].ready

    try:
        assert asyncio.run(first_submission()) == (8, False)
    finally:
        pool.close()
    assert pool.live_workers() == []


def test_pipelined_bodies_get_their_own_answers_in_order() -> None:
    pool = ValidatorPool(1, "warn", 1 << 30)
    bodies = [orjson.dumps(big_group(score=s, submission_id=f"id-{s}")) for s in range(12)]
    bad = big_group()
    bad["masks"] = bad["masks"][:-1]
    bodies[5] = orjson.dumps(bad)

    async def submit_all() -> list[object]:
        await pool.inspect(bodies[0], gzipped=False)  # starts the worker
        while not pool._workers[0].ready:
            await asyncio.sleep(0.05)
        return await asyncio.gather(*(pool.inspect(b, gzipped=False) for b in bodies), return_exceptions=True)

    try:
        outcomes = asyncio.run(submit_all())
    finally:
        pool.close()
    assert isinstance(outcomes[5], BodyInvalid) and "body.masks" in str(outcomes[5])
    assert [o.submission_id for i, o in enumerate(outcomes) if i != 5] == [f"id-{s}" for s in range(12) if s != 5]


def test_the_worker_imports_neither_fastapi_nor_the_server() -> None:
    code = ("import sys, atroposlib.api.validator_pool; "
            "print(any(m in sys.modules for m in ('fastapi', 'atroposlib.api.server')))")
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip() == "False"


def test_the_server_starts_its_workers_with_the_first_large_body(make_client) -> None:
    client = make_client(validation_workers=2)
    start_run(client, 8)
    validators = client.app.state.runtime().validators
    assert validators.live_workers() == []
    assert client.post("/scored_data", json=group(8, env_id=0)).json() == {"status": "received"}
    assert validators.live_workers() == []
    assert client.post("/scored_data", json=big_group()).json() == {"status": "received"}
    assert len(validators.live_workers()) == 2


def test_workers_that_cannot_start_leave_the_checks_to_the_server(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "executable", "/bin/false")  # every worker exits at once
    pool = ValidatorPool(2, "warn", 1 << 30)
    body = orjson.dumps(big_group())

    async def submit_until_the_pool_gives_up() -> list[int]:
        sizes = []
        while pool.workers and len(sizes) < 100:
            sizes.append((await pool.inspect(body, gzipped=False)).size)
            await asyncio.sleep(0.05)
        return sizes

    try:
        sizes = asyncio.run(submit_until_the_pool_gives_up())
        assert pool.workers == 0 and set(sizes) == {8}
    finally:
        pool.close()
