"""Leased batches: at-least-once delivery with ack, nack, expiry and dead letters."""

from __future__ import annotations

import json
import socket
import time
from pathlib import Path

import httpx
from fastapi.testclient import TestClient

from tests.conftest import env_registration, group, registration, start_run
from tests.helpers import ApiProcess


def _fill(client: TestClient, n: int, size: int = 8) -> None:
    for score in range(n):
        client.post("/scored_data", json=group(size, env_id=0, score=score))


def test_lease_then_ack_advances_the_step(client: TestClient) -> None:
    start_run(client, 8)
    _fill(client, 2)
    lease = client.post("/batch", json={"lease_seconds": 30}).json()
    assert lease["batch_id"].startswith("b-") and lease["step"] == 0 and len(lease["batch"]) == 1
    assert client.get("/status").json()["queue_size"] == 2  # leased groups still count
    assert client.post(f"/batch/{lease['batch_id']}/ack").json() == {"status": "acked", "current_step": 1}
    assert client.post(f"/batch/{lease['batch_id']}/ack").json()["status"] == "already_acked"
    assert client.get("/status").json()["queue_size"] == 1


def test_post_batch_without_body_and_when_empty(client: TestClient) -> None:
    start_run(client, 8)
    assert client.post("/batch").json() == {"batch_id": None, "batch": None}


def test_post_batch_with_a_body_that_is_not_json_is_422(client: TestClient) -> None:
    start_run(client, 8)
    _fill(client, 1)
    for body in (b"\x0b", b"\x0c", b"not json", b"{"):
        response = client.post("/batch", content=body, headers={"content-type": "application/json"})
        assert response.status_code == 422, (body, response.text)
    assert client.post("/batch", content=b" \r\n\t ").json()["batch_id"] is not None  # JSON whitespace: no body
    assert client.get("/status").json()["queue_size"] == 1


def test_post_batch_requires_registration(client: TestClient) -> None:
    response = client.post("/batch")
    assert response.status_code == 409 and response.json()["error"]["code"] == "not_registered"


def test_nack_returns_groups_to_the_head_in_order(client: TestClient) -> None:
    start_run(client, 16)
    _fill(client, 3)
    lease = client.post("/batch").json()
    assert client.post(f"/batch/{lease['batch_id']}/nack").json()["status"] == "nacked"
    again = client.post("/batch").json()
    assert [item["scores"][0] for item in again["batch"]] == [0, 1]
    assert client.get("/status").json()["current_step"] == 0


def test_expired_lease_is_served_again_and_late_ack_is_410(client: TestClient, clock) -> None:
    start_run(client, 8)
    _fill(client, 1)
    first = client.post("/batch", json={"lease_seconds": 10}).json()
    clock.advance(11)
    second = client.post("/batch").json()
    assert second["batch"] == first["batch"] and second["batch_id"] != first["batch_id"]
    late = client.post(f"/batch/{first['batch_id']}/ack")
    assert late.status_code == 410 and late.json()["error"]["code"] == "lease_expired"


def test_a_late_ack_stands_while_no_other_batch_has_taken_the_groups(client: TestClient, clock) -> None:
    start_run(client, 8)
    _fill(client, 2)
    lease = client.post("/batch", json={"lease_seconds": 10}).json()
    clock.advance(11)
    assert client.get("/status").json()["queue_size"] == 2  # expired: back in the queue
    assert client.post(f"/batch/{lease['batch_id']}/ack").json() == {"status": "acked", "current_step": 1}
    status = client.get("/status").json()
    assert status["queue_size"] == 1 and status["current_step"] == 1
    assert [item["scores"][0] for item in client.post("/batch").json()["batch"]] == [1]  # not served twice


def test_a_lease_survives_a_restart_of_the_server(make_client, tmp_path) -> None:
    client = make_client(state_dir=tmp_path)
    start_run(client, 8)
    _fill(client, 2)
    lease = client.post("/batch", json={"lease_seconds": 600}).json()
    client.__exit__(None, None, None)  # the server stops; its state stays on disk
    restarted = make_client(state_dir=tmp_path)
    assert restarted.post(f"/batch/{lease['batch_id']}/ack").json() == {"status": "acked", "current_step": 1}
    assert [item["scores"][0] for item in restarted.post("/batch").json()["batch"]] == [1]


def test_repeatedly_expiring_groups_are_dead_lettered(make_client, clock) -> None:
    client = make_client(max_redeliveries=2)
    start_run(client, 8)
    _fill(client, 1)
    for _ in range(2):
        client.post("/batch", json={"lease_seconds": 1})
        clock.advance(2)
    client.get("/status")
    assert client.post("/batch").json()["batch"] is None
    assert client.get("/envs").json()["dead_letters"][0]["groups"] == 1
    assert client.get("/health").json()["status"] == "degraded"


def test_unknown_lease_is_404(client: TestClient) -> None:
    start_run(client)
    assert client.post("/batch/b-999999/ack").status_code == 404
    assert client.post("/batch/b-999999/nack").json()["error"]["code"] == "lease_not_found"


def test_served_log_recovers_served_batches(client: TestClient) -> None:
    start_run(client, 8)
    _fill(client, 2)
    client.get("/batch")
    lease = client.post("/batch").json()
    client.post(f"/batch/{lease['batch_id']}/ack")
    served = client.get("/batches/served?since=0").json()["batches"]
    assert [(b["step"], b["batch"][0]["scores"][0]) for b in served] == [(1, 0.0), (2, 1.0)]
    assert client.get("/batches/served?since=2").json()["batches"][0]["batch_id"] == lease["batch_id"]


def test_long_poll_waits_for_data(client: TestClient) -> None:
    start_run(client, 8)
    response = client.post("/batch", json={"wait_seconds": 0.2}).json()
    assert response == {"batch_id": None, "batch": None}


def test_a_long_poll_whose_client_hangs_up_ends_and_leases_nothing(tmp_path: Path) -> None:
    with ApiProcess(tmp_path / "state") as api:
        httpx.post(f"{api.url}/register", json=registration(8)).raise_for_status()
        httpx.get(f"{api.url}/batch").raise_for_status()
        httpx.post(f"{api.url}/register-env", json=env_registration("env", 8)).raise_for_status()
        body = json.dumps({"wait_seconds": 30}).encode()
        with socket.create_connection(("127.0.0.1", api.port), timeout=20) as waiting:
            waiting.sendall(b"POST /batch HTTP/1.1\r\nHost: api\r\nContent-Type: application/json\r\n"
                            b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
            time.sleep(0.5)  # the API holds the request: no batch yet
            waiting.shutdown(socket.SHUT_WR)  # its client is gone, as a trainer stopped mid-wait
            assert waiting.recv(1024) == b""  # the wait ends at once, with nothing to read
        httpx.post(f"{api.url}/scored_data", json=group(8, env_id=0, score=3)).raise_for_status()
        time.sleep(0.3)
        assert httpx.get(f"{api.url}/status").json()["leased_batches"] == 0
        lease = httpx.post(f"{api.url}/batch").json()
        assert lease["batch"][0]["scores"][0] == 3
