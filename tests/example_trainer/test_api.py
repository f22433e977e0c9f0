"""The trainer's trajectory-API client against the real API, served by uvicorn on a free
loopback port in a thread (``requests`` needs a socket)."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

import httpx
import pytest
import requests
import uvicorn
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from atroposlib.api import ApiSettings, create_app
from atroposlib import trainer_api
from example_trainer import api
from example_trainer.api import AtroposApiError, BatchFeed, RetryPolicy, check_atropos_api, get_batch, register_trainer
from example_trainer.config import TrainingConfig
from tests.conftest import env_registration, group
from tests.helpers import free_port

GROUP_SIZE = 8


class ThreadedServer:
    """An ASGI app served by uvicorn on a free loopback port, in a thread of this process."""

    def __init__(self, app: ASGIApp, port: Optional[int] = None) -> None:
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning", access_log=False)
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> "ThreadedServer":
        self.thread.start()
        deadline = time.monotonic() + 20
        while not self.server.started:
            assert time.monotonic() < deadline and self.thread.is_alive(), "uvicorn did not start"
            time.sleep(0.02)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(20)


def api_app(**settings: Any) -> ASGIApp:
    return create_app(ApiSettings(ephemeral=True, validation_workers=0, **settings))


@pytest.fixture(autouse=True)
def short_retries(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ATROPOS_API_KEY", raising=False)
    monkeypatch.setattr(trainer_api, "RETRY", RetryPolicy(attempts=3, min_wait=0.01, max_wait=0.05))


@pytest.fixture
def server() -> Iterator[ThreadedServer]:
    with ThreadedServer(api_app()) as running:
        yield running


def config_for(url: str, **fields: Any) -> TrainingConfig:
    # 4 x 2 = 8 sequences per batch: one group of GROUP_SIZE per batch
    return TrainingConfig(model_name="m", atropos_url=url, batch_size=4, gradient_accumulation_steps=2, **fields)


def start_run(url: str, batches: int, headers: Optional[dict[str, str]] = None) -> None:
    """Register a trainer, open the run, register one env and queue `batches` one-group batches
    (group i has score i)."""
    register_trainer(config_for(url))
    httpx.post(f"{url}/batch", headers=headers).raise_for_status()  # marks the run started
    httpx.post(f"{url}/register-env", json=env_registration("env", GROUP_SIZE), headers=headers).raise_for_status()
    for score in range(batches):
        response = httpx.post(f"{url}/scored_data", json=group(GROUP_SIZE, env_id=0, score=score), headers=headers)
        response.raise_for_status()


def leased_count(url: str) -> int:
    return httpx.get(f"{url}/status").json()["leased_batches"]


def wait_for(predicate: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.05)


def score_of(batch: api.LeasedBatch) -> float:
    return batch.items[0]["scores"][0]


def test_registration_payload_is_atroposs_plus_the_staleness_bound() -> None:
    payload = api.registration_payload(TrainingConfig(model_name="m"))
    assert payload == {"wandb_group": "", "wandb_project": "", "batch_size": 64, "max_token_len": 2048,
                       "starting_step": 0, "checkpoint_dir": "trained_model_checkpoints",
                       "save_checkpoint_interval": 3, "num_steps": 10, "max_staleness": 6}
    config = TrainingConfig(model_name="m", checkpoint_interval=0, training_steps=7, wandb_project="p",
                            wandb_group="g", save_path="out", seq_len=512, max_staleness=-1)
    assert api.registration_payload(config, starting_step=5) == {  # no bound: Atropos's eight fields exactly
        "wandb_group": "g", "wandb_project": "p", "batch_size": 64, "max_token_len": 512, "starting_step": 5,
        "checkpoint_dir": "out", "save_checkpoint_interval": 7, "num_steps": 7}
    assert api.registration_payload(TrainingConfig(model_name="m", max_staleness=0))["max_staleness"] == 0


def test_register_with_a_starting_step(server: ThreadedServer) -> None:
    answer = register_trainer(config_for(server.url, seq_len=512), starting_step=3)
    assert "uuid" in answer
    assert httpx.get(f"{server.url}/info").json() == {"batch_size": 8, "max_token_len": 512}
    assert httpx.get(f"{server.url}/status").json()["current_step"] == 3


def test_check_atropos_api(server: ThreadedServer) -> None:
    assert check_atropos_api(server.url, timeout=5)
    started = time.monotonic()
    assert not check_atropos_api(f"http://127.0.0.1:{free_port()}", timeout=0.5)
    assert time.monotonic() - started < 5


def test_get_batch_before_registration_is_an_error(server: ThreadedServer) -> None:
    with pytest.raises(AtroposApiError, match="not registered"):
        get_batch(server.url)


def test_lease_next_and_ack(server: ThreadedServer) -> None:
    start_run(server.url, 2)
    with BatchFeed(server.url, max_prefetch_batches=1, wait_seconds=0.2) as feed:
        first = feed.next(timeout=10)
        assert first.batch_id is not None and score_of(first) == 0 and len(first.items) == 1
        assert first.items[0]["tokens"] == group(GROUP_SIZE)["tokens"]
        assert feed.ack(first) == 1
        second = feed.next(timeout=10)
        assert score_of(second) == 1
        assert feed.ack(second) == 2
    assert httpx.get(f"{server.url}/status").json()["current_step"] == 2


def test_prefetch_never_holds_more_than_the_limit(server: ThreadedServer) -> None:
    start_run(server.url, 6)
    seen: list[int] = []
    with BatchFeed(server.url, max_prefetch_batches=2, wait_seconds=0.2) as feed:
        wait_for(lambda: leased_count(server.url) == 2)
        for _ in range(10):
            seen.append(leased_count(server.url))
            time.sleep(0.05)
        batch = feed.next(timeout=10)  # the one being trained still counts
        for _ in range(10):
            seen.append(leased_count(server.url))
            time.sleep(0.05)
        feed.ack(batch)
        wait_for(lambda: leased_count(server.url) == 2)  # the freed slot is refilled
        for _ in range(10):
            seen.append(leased_count(server.url))
            time.sleep(0.05)
        assert [score_of(feed.next(timeout=10)) for _ in range(2)] == [1, 2]
    assert max(seen) == 2


def test_close_gives_back_unacknowledged_batches(server: ThreadedServer) -> None:
    start_run(server.url, 3)
    feed = BatchFeed(server.url, max_prefetch_batches=2, wait_seconds=0.2)
    wait_for(lambda: leased_count(server.url) == 2)
    in_training = feed.next(timeout=10)
    assert score_of(in_training) == 0
    feed.close()  # a crash before the ack: batch 0 (taken) and batch 1 (prefetched) go back
    assert leased_count(server.url) == 0
    with BatchFeed(server.url, max_prefetch_batches=1, wait_seconds=0.2) as again:
        batch = again.next(timeout=10)
        assert score_of(batch) == 0
        again.ack(batch)
        assert score_of(again.next(timeout=10)) == 1
    assert httpx.get(f"{server.url}/status").json()["current_step"] == 1


def test_close_ends_the_lease_it_waits_on_at_once_and_the_api_leases_nothing_to_it(server: ThreadedServer) -> None:
    start_run(server.url, 0)
    feed = BatchFeed(server.url, max_prefetch_batches=1, wait_seconds=30)
    time.sleep(0.5)
    with pytest.raises(TimeoutError):  # its lease request waits in the API's long poll
        feed.next(timeout=0.1)
    started = time.monotonic()
    feed.close()
    assert time.monotonic() - started < 10, "close() waited for the long poll to run out"
    httpx.post(f"{server.url}/scored_data", json=group(GROUP_SIZE, env_id=0, score=7)).raise_for_status()
    time.sleep(0.3)
    assert leased_count(server.url) == 0
    with BatchFeed(server.url, max_prefetch_batches=1, wait_seconds=0.2) as again:
        assert score_of(again.next(timeout=10)) == 7


def test_an_interrupted_session_interrupts_the_connections_it_opens_later_too(server: ThreadedServer) -> None:
    session = trainer_api.InterruptibleSession()
    session.interrupt()
    started = time.monotonic()
    with pytest.raises(requests.ConnectionError):
        session.post(f"{server.url}/batch", json={"wait_seconds": 30}, timeout=30)
    assert time.monotonic() - started < 10
    session.close()


def test_nack_serves_the_batch_again(server: ThreadedServer) -> None:
    start_run(server.url, 2)
    with BatchFeed(server.url, max_prefetch_batches=1, wait_seconds=0.2) as feed:
        batch = feed.next(timeout=10)
        feed.nack(batch)
        assert score_of(feed.next(timeout=10)) == score_of(batch) == 0


def test_a_late_ack_stands_unless_another_batch_took_the_groups_and_then_names_the_lease_setting(
        server: ThreadedServer) -> None:
    start_run(server.url, 2)
    with BatchFeed(server.url, max_prefetch_batches=1, lease_seconds=0.3, wait_seconds=0.2) as feed:
        batch = feed.next(timeout=10)
        time.sleep(0.6)
        assert feed.ack(batch) == 1  # expired, but nobody took its groups since
        batch = feed.next(timeout=10)
        # another consumer takes its groups once the API has expired the lease (its housekeeping
        # runs at most once a second, so the first tries may find nothing yet)
        wait_for(lambda: httpx.post(f"{server.url}/batch").json()["batch"] is not None)
        with pytest.raises(AtroposApiError, match="--lease-seconds"):
            feed.ack(batch)


def durable_app(state_dir: Path) -> ASGIApp:
    return create_app(ApiSettings(state_dir=state_dir, validation_workers=0))


def test_a_feed_rides_out_an_api_restart(tmp_path: Path) -> None:
    port = free_port()
    lines: list[str] = []
    first = ThreadedServer(durable_app(tmp_path), port=port).__enter__()
    start_run(first.url, 2)
    feed = BatchFeed(first.url, max_prefetch_batches=1, wait_seconds=0.2, poll_interval=0.05, progress_every=0.2,
                     outage_seconds=30, log=lines.append)
    try:
        batch = feed.next(timeout=10)
        first.__exit__()
        done: list[int] = []
        acking = threading.Thread(target=lambda: done.append(feed.ack(batch)))
        acking.start()
        time.sleep(1.0)
        assert not done and any("does not answer" in line for line in lines)
        with ThreadedServer(durable_app(tmp_path), port=port):  # restarted: its state read back from disk
            acking.join(20)
            assert done == [1]
    finally:
        feed.close()


def test_a_feed_gives_up_on_an_api_gone_for_longer_than_its_outage_limit(server: ThreadedServer) -> None:
    start_run(server.url, 1)
    feed = BatchFeed(server.url, max_prefetch_batches=1, wait_seconds=0.2, poll_interval=0.05, outage_seconds=0.5,
                     log=lambda line: None)
    batch = feed.next(timeout=10)
    server.__exit__()
    with pytest.raises(AtroposApiError, match="did not come back within 0.5 s"):
        feed.ack(batch)
    feed.close()


def test_next_times_out_and_reports_waiting(server: ThreadedServer) -> None:
    register_trainer(config_for(server.url))
    lines: list[str] = []
    with BatchFeed(server.url, wait_seconds=0.1, poll_interval=0.05, progress_every=0.3, log=lines.append) as feed:
        with pytest.raises(TimeoutError):
            feed.next(timeout=1.5)
    assert 2 <= len(lines) <= 5 and all("waiting for batches from the environments" in line for line in lines)


def test_unregistered_lease_surfaces_in_next(server: ThreadedServer) -> None:
    with BatchFeed(server.url, wait_seconds=0.1) as feed:
        with pytest.raises(AtroposApiError, match="409"):
            feed.next(timeout=10)


def without_leases(app: ASGIApp, status: int) -> ASGIApp:
    """`app` as an older API: POST /batch answers `status`."""
    async def wrapped(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST" and scope["path"] == "/batch":
            await JSONResponse({"detail": "Not Found"}, status_code=status)(scope, receive, send)
            return
        await app(scope, receive, send)
    return wrapped


@pytest.mark.parametrize("status", [404, 405])
def test_falls_back_to_get_batch_without_leases(status: int) -> None:
    with ThreadedServer(without_leases(api_app(), status)) as old:
        register_trainer(config_for(old.url))
        httpx.get(f"{old.url}/batch").raise_for_status()  # opens the run, like Atropos's trainer
        httpx.post(f"{old.url}/register-env", json=env_registration("env", GROUP_SIZE)).raise_for_status()
        for score in range(3):
            httpx.post(f"{old.url}/scored_data", json=group(GROUP_SIZE, env_id=0, score=score)).raise_for_status()
        lines: list[str] = []
        with BatchFeed(old.url, max_prefetch_batches=1, poll_interval=0.05, log=lines.append) as feed:
            scores = []
            for _ in range(3):
                batch = feed.next(timeout=10)
                assert batch.batch_id is None
                scores.append(score_of(batch))
                assert feed.ack(batch) == len(scores)
        assert scores == [0, 1, 2]
        assert len([line for line in lines if "GET /batch" in line]) == 1


def test_bearer_token_is_sent(monkeypatch: pytest.MonkeyPatch) -> None:
    with ThreadedServer(api_app(api_key="s3cret")) as guarded:
        with pytest.raises(AtroposApiError, match="401.*ATROPOS_API_KEY") as refused:
            register_trainer(config_for(guarded.url))
        assert refused.value.status == 401
        assert not check_atropos_api(guarded.url, timeout=0)
        monkeypatch.setenv("ATROPOS_API_KEY", "s3cret")
        assert check_atropos_api(guarded.url, timeout=5)
        start_run(guarded.url, 1, headers={"Authorization": "Bearer s3cret"})
        with BatchFeed(guarded.url, max_prefetch_batches=1, wait_seconds=0.2) as feed:
            assert feed.ack(feed.next(timeout=10)) == 1


def flaky(app: ASGIApp, path: str, failures: int, status: int, calls: list[int]) -> ASGIApp:
    """`app`, except that the first `failures` requests to `path` answer `status`."""
    async def wrapped(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] == path:
            calls.append(1)
            if len(calls) <= failures:
                await JSONResponse({"error": "injected"}, status_code=status)(scope, receive, send)
                return
        await app(scope, receive, send)
    return wrapped


def test_transient_errors_are_retried() -> None:
    calls: list[int] = []
    with ThreadedServer(flaky(api_app(), "/register", 2, 503, calls)) as server:
        assert "uuid" in register_trainer(config_for(server.url))
    assert len(calls) == 3


def test_transient_errors_give_up_after_the_attempts() -> None:
    calls: list[int] = []
    with ThreadedServer(flaky(api_app(), "/register", 10, 503, calls)) as server:
        with pytest.raises(AtroposApiError, match="503"):
            register_trainer(config_for(server.url))
    assert len(calls) == 3


def test_refusals_are_not_retried() -> None:
    calls: list[int] = []
    with ThreadedServer(flaky(api_app(), "/register", 10, 422, calls)) as server:
        with pytest.raises(AtroposApiError, match="422"):
            register_trainer(config_for(server.url))
    assert len(calls) == 1


def test_an_unreachable_api_is_one_clear_error() -> None:
    with pytest.raises(AtroposApiError, match="did not answer"):
        get_batch(f"http://127.0.0.1:{free_port()}")
