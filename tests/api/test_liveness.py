"""Environments that stop talking are marked disconnected; talking again revives them."""

from __future__ import annotations

from tests.conftest import env_registration, group, start_run


def test_silent_env_times_out_and_revives(make_client, clock) -> None:
    client = make_client(env_timeout=100)
    start_run(client)
    clock.advance(101)
    assert client.get("/envs").json()["envs"][0]["connected"] is False
    assert client.post("/heartbeat-env", json={"env_id": 0}).json() == {"status": "ok"}
    assert client.get("/envs").json()["envs"][0]["connected"] is True


def test_submissions_are_liveness_signals(make_client, clock) -> None:
    client = make_client(env_timeout=100)
    start_run(client)
    for _ in range(3):
        clock.advance(60)
        client.post("/scored_data", json=group(8, env_id=0))
    assert client.get("/envs").json()["envs"][0]["connected"] is True


def test_env_key_reuses_a_disconnected_record(client) -> None:
    start_run(client, envs=())
    first = client.post("/register-env", json=env_registration("math", env_key="node1:0")).json()
    client.post("/disconnect-env", json={"env_id": first["env_id"]})
    again = client.post("/register-env", json=env_registration("math", env_key="node1:0")).json()
    assert (again["env_id"], again["wandb_name"]) == (first["env_id"], "math_0")
    other = client.post("/register-env", json=env_registration("math", env_key="node2:0")).json()
    assert other["wandb_name"] == "math_1"


def test_heartbeat_for_unknown_env_is_404(client) -> None:
    start_run(client)
    assert client.post("/heartbeat-env", json={"env_id": 3}).status_code == 404


def test_timeout_zero_disables_liveness(make_client, clock) -> None:
    client = make_client(env_timeout=0)
    start_run(client)
    clock.advance(10**6)
    assert client.get("/envs").json()["envs"][0]["connected"] is True
