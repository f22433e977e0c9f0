"""Mixed-size buffering: Atropos's results, without groups stuck forever."""

from __future__ import annotations

from fastapi.testclient import TestClient

from tests.conftest import group, start_run


def test_two_small_groups_for_a_size_two_env_are_both_queued(client: TestClient) -> None:
    start_run(client, 4, envs=(("e", 2),))
    assert client.post("/scored_data", json=group(1, env_id=0)).json() == {"status": "buffered", "buffer_size": 1}
    assert client.post("/scored_data", json=group(1, env_id=0)).json() == {"status": "buffered", "buffer_size": 0}
    assert client.get("/status").json()["queue_size"] == 2


def test_larger_group_is_queued_directly_with_a_warning(client: TestClient) -> None:
    start_run(client, 4, envs=(("e", 2),))
    response = client.post("/scored_data", json=group(3, env_id=0)).json()
    assert response["status"] == "received" and "larger" in response["warnings"][0]
    assert client.get("/status").json()["queue_size"] == 1


def test_envless_and_exact_groups_bypass_the_buffer(client: TestClient) -> None:
    start_run(client, 4, envs=(("e", 2),))
    assert client.post("/scored_data", json=group(1)).json() == {"status": "received"}
    assert client.post("/scored_data", json=group(2, env_id=0)).json() == {"status": "received"}


def test_unknown_env_id_is_kept_with_a_warning_or_rejected_when_strict(make_client) -> None:
    lenient = make_client()
    start_run(lenient, 4, envs=(("e", 2),))
    response = lenient.post("/scored_data", json=group(1, env_id=7)).json()
    assert response["status"] == "received" and "not a registered env" in response["warnings"][0]
    strict = make_client(validation="strict")
    start_run(strict, 4, envs=(("e", 2),))
    refused = strict.post("/scored_data", json=group(1, env_id=7))
    assert refused.status_code == 404 and refused.json()["error"]["code"] == "unknown_env"


def test_stale_buffered_groups_are_queued_after_the_ttl(make_client, clock) -> None:
    client = make_client(buffer_ttl=60)
    start_run(client, 4, envs=(("e", 4),))
    client.post("/scored_data", json=group(3, env_id=0))
    assert client.get("/status").json()["buffered_sequences"] == 3
    clock.advance(61)
    status = client.get("/status").json()
    assert status["buffered_sequences"] == 0 and status["queue_size"] == 1
    assert "atropos_buffer_flushed_total" in client.get("/metrics").text


def test_buffer_size_cap_flushes_the_oldest(make_client) -> None:
    client = make_client(max_buffered_sequences=6)
    start_run(client, 8, envs=(("e", 8),))
    for _ in range(3):
        client.post("/scored_data", json=group(3, env_id=0))
    status = client.get("/status").json()
    assert status["buffered_sequences"] <= 6 and status["queue_size"] >= 1
