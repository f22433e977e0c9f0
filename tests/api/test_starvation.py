"""Batches form even when Atropos's rules would starve, and impossible cases are surfaced."""

from __future__ import annotations

from fastapi.testclient import TestClient

from tests.conftest import env_registration, group, start_run


def test_sizes_not_dividing_the_largest_are_batched_after_the_grace(make_client, clock) -> None:
    client = make_client(starvation_grace=30)
    start_run(client, 8, envs=(("a", 3), ("b", 5)))
    client.post("/scored_data", json=group(3, env_id=0))
    client.post("/scored_data", json=group(5, env_id=1))
    assert client.get("/batch").json()["batch"] is None
    clock.advance(31)
    batch = client.get("/batch").json()["batch"]
    assert sorted(len(item["tokens"]) for item in batch) == [3, 5]


def test_batch_size_not_a_multiple_of_the_group_size(make_client, clock) -> None:
    client = make_client(starvation_grace=0)
    start_run(client, 12, envs=(("a", 4), ("b", 8)))
    for env_id, size in ((1, 8), (1, 8), (0, 4)):
        client.post("/scored_data", json=group(size, env_id=env_id))
    batch = client.get("/batch").json()["batch"]
    assert sum(len(item["tokens"]) for item in batch) == 12


def test_unpackable_queue_is_reported(client: TestClient) -> None:
    start_run(client, 12)
    client.post("/scored_data", json=group(8, env_id=0))
    client.post("/scored_data", json=group(8, env_id=0))
    health = client.get("/health").json()
    assert health["status"] == "degraded"
    assert "batch_size 12 is not reachable from group sizes [8]" in health["warnings"][0]
    assert "atropos_unpackable 1.0" in client.get("/metrics").text


def test_dead_env_with_minimum_no_longer_blocks_batches(make_client, clock) -> None:
    client = make_client(env_timeout=60)
    start_run(client, 16)
    client.post("/register-env", json=env_registration("needy", 8, min_batch_allocation=0.5))
    client.post("/scored_data", json=group(8, env_id=0))
    client.post("/scored_data", json=group(8, env_id=0))
    assert client.get("/batch").json()["batch"] is None
    clock.advance(61)
    client.get("/status-env?env_id=0")  # env 0 is alive; env 1 has gone silent
    assert len(client.get("/batch").json()["batch"]) == 2
    envs = {e["real_name"]: e["connected"] for e in client.get("/envs").json()["envs"]}
    assert envs == {"env_0": True, "needy_0": False}


def test_fallback_honours_minimums_when_it_can(make_client, clock) -> None:
    client = make_client(starvation_grace=0)
    start_run(client, 8, envs=(("a", 3), ("b", 5)), min_batch_allocation=0.3)
    for env_id, size in ((0, 3), (0, 3), (1, 5)):
        client.post("/scored_data", json=group(size, env_id=env_id))
    batch = client.get("/batch").json()["batch"]
    assert sorted(item["env_id"] for item in batch) == [0, 1]
