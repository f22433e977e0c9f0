"""The run's staleness bound: groups sampled too many trainer steps ago are dropped, not served."""

from __future__ import annotations

import gzip
import logging
import sqlite3
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

import orjson
import pytest
from fastapi.testclient import TestClient

from atroposlib.api import ApiSettings, create_app
from tests.api.test_validator_pool import pooled_client
from tests.conftest import FakeClock, env_registration, group, registration

# The items table as servers before policy versions wrote it.
OLD_ITEMS_TABLE = """
CREATE TABLE items (
    seq INTEGER PRIMARY KEY, pos INTEGER, state TEXT NOT NULL, env_id INTEGER, size INTEGER NOT NULL,
    t REAL NOT NULL, batch_id TEXT, step INTEGER, expirations INTEGER NOT NULL DEFAULT 0, data BLOB NOT NULL
);
CREATE TABLE meta (key TEXT PRIMARY KEY, value BLOB NOT NULL);
"""


def sampled(version: Optional[int], score: float, size: int = 8) -> dict[str, Any]:
    """A group of env 0 sampled by policy `version` (None: the group does not say)."""
    params = {"temperature": 1.0} if version is None else {"temperature": 1.0, "policy_version": version}
    return group(size, env_id=0, score=score, generation_params=params)


def start(client: TestClient, batch_size: int = 8, **fields: Any) -> None:
    """Register the trainer (`fields` added to the registration), open the gate, register env 0."""
    assert client.post("/register", json=registration(batch_size, **fields)).status_code == 200
    client.get("/batch")
    assert client.post("/register-env", json=env_registration("env", 8)).json()["env_id"] == 0


def submit(client: TestClient, *groups: dict[str, Any]) -> None:
    for body in groups:
        assert client.post("/scored_data", json=body).json()["status"] == "received"


def scores(batch: Optional[list[dict[str, Any]]]) -> list[float]:
    return [item["scores"][0] for item in batch or []]


@contextmanager
def durable_server(state_dir: Path, clock: FakeClock) -> Iterator[TestClient]:
    with TestClient(create_app(ApiSettings(state_dir=state_dir), clock=clock)) as client:
        yield client


# -- registration -------------------------------------------------------------------------
def test_registration_without_the_field_has_no_bound(client: TestClient) -> None:
    start(client)
    status = client.get("/status").json()
    assert status["max_staleness"] is None and status["dropped_groups"] == {}
    assert status["unknown_version_groups"] == 0


@pytest.mark.parametrize("value, accepted", [(0, True), (3, True), (2.0, True), (None, True),
                                             (-1, False), ("2", False), (True, False), (2.5, False)])
def test_max_staleness_is_a_non_negative_integer(client: TestClient, value: Any, accepted: bool) -> None:
    response = client.post("/register", json=registration(8, max_staleness=value))
    assert (response.status_code == 200) is accepted, response.json()
    if accepted:
        assert client.get("/status").json()["max_staleness"] == (None if value is None else int(value))
    else:
        assert response.json()["detail"][0]["loc"] == ["body", "max_staleness"]


def test_schema_documents_the_optional_field(client: TestClient) -> None:
    schema = client.get("/openapi.json").json()["paths"]["/register"]["post"]["requestBody"]
    body = schema["content"]["application/json"]["schema"]
    assert "max_staleness" in body["properties"] and "max_staleness" not in body["required"]


# -- dropping -----------------------------------------------------------------------------
def test_without_a_bound_old_groups_are_served(client: TestClient) -> None:
    start(client, starting_step=50)
    submit(client, sampled(0, 0), sampled(None, 1))
    assert scores(client.get("/batch").json()["batch"]) == [0]
    assert scores(client.get("/batch").json()["batch"]) == [1]
    assert client.get("/status").json()["dropped_groups"] == {}


def test_get_batch_drops_stale_groups_and_serves_unknown_ones(client: TestClient) -> None:
    start(client, starting_step=5, max_staleness=1)
    submit(client, sampled(3, 0), sampled(4, 1), sampled(None, 2), sampled(9, 3))
    assert scores(client.get("/batch").json()["batch"]) == [1]  # 5 - 3 > 1: dropped; 5 - 4 = 1 served
    assert scores(client.get("/batch").json()["batch"]) == [2]  # unknown: served
    assert scores(client.get("/batch").json()["batch"]) == [3]  # newer than the trainer: staleness 0
    assert client.get("/batch").json()["batch"] is None
    status = client.get("/status").json()
    assert status["dropped_groups"] == {"stale": 1} and status["unknown_version_groups"] == 1
    assert (status["current_step"], status["queue_size"]) == (8, 0)


def test_health_warns_while_fresh_groups_are_dropped_as_stale_and_no_batch_is_out(
        client: TestClient, clock: FakeClock) -> None:
    start(client, starting_step=4, max_staleness=1)  # as a run the API holds at step 4
    assert client.get("/health").json()["warnings"] == []
    submit(client, sampled(1, 0), sampled(2, 1))  # a trainer restarted at step 0 syncs versions 1, 2
    assert client.post("/batch").json()["batch"] is None
    health = client.get("/health").json()
    assert health["status"] == "degraded"
    assert "2 group(s) dropped as stale" in health["warnings"][0] and "the API is at step 4" in health["warnings"][0]
    clock.advance(121)
    assert client.get("/health").json()["warnings"] == []


def test_zero_bound_serves_only_groups_of_the_current_weights(client: TestClient) -> None:
    start(client, starting_step=2, max_staleness=0)
    submit(client, sampled(1, 0), sampled(2, 1))
    assert scores(client.get("/batch").json()["batch"]) == [1]
    assert client.get("/status").json()["dropped_groups"] == {"stale": 1}


def test_the_oldest_rollout_decides(client: TestClient) -> None:
    start(client, starting_step=4, max_staleness=1)
    mixed = sampled(4, 0)
    mixed["overrides"] = [{}] * 7 + [{"policy_version": 2}]
    submit(client, mixed, sampled(4, 1))
    assert scores(client.get("/batch").json()["batch"]) == [1]
    assert client.get("/status").json()["dropped_groups"] == {"stale": 1}


def test_leases_count_outstanding_batches_toward_the_training_step(client: TestClient) -> None:
    start(client, max_staleness=1)
    submit(client, sampled(0, 0), sampled(0, 1), sampled(0, 2), sampled(1, 3), sampled(0, 4))
    first = client.post("/batch").json()  # trains at step 0: staleness 0
    second = client.post("/batch").json()  # at step 1 (one lease outstanding): staleness 1
    assert scores(first["batch"]) == [0] and scores(second["batch"]) == [1]
    third = client.post("/batch").json()  # at step 2: version 0 is 2 steps stale, version 1 is 1
    assert scores(third["batch"]) == [3]
    assert client.get("/status").json()["dropped_groups"] == {"stale": 2}  # groups 2 and 4
    for lease in (first, second, third):
        assert client.post(f"/batch/{lease['batch_id']}/ack").status_code == 200
    status = client.get("/status").json()
    assert (status["current_step"], status["queue_size"], status["leased_batches"]) == (3, 0, 0)


def test_expired_leases_no_longer_count(client: TestClient, clock: FakeClock) -> None:
    start(client, max_staleness=0)
    submit(client, sampled(0, 0), sampled(0, 1))
    client.post("/batch", json={"lease_seconds": 5})
    clock.advance(6)
    client.get("/status")  # housekeeping expires the lease: group 0 is back at the head
    again = client.post("/batch").json()  # trains at step 0 again
    assert scores(again["batch"]) == [0]
    assert client.get("/status").json()["dropped_groups"] == {}


def test_dropped_groups_stay_in_the_journal(tmp_path: Path, clock: FakeClock) -> None:
    with durable_server(tmp_path, clock) as client:
        start(client, starting_step=3, max_staleness=0)
        submit(client, sampled(1, 0), sampled(2, 1))
        assert client.get("/batch").json()["batch"] is None
    db = sqlite3.connect(tmp_path / "state.sqlite3")
    rows = db.execute("SELECT state, reason, step, policy_version, data FROM items ORDER BY seq").fetchall()
    db.close()
    assert [row[:4] for row in rows] == [("dropped", "stale", 3, 1), ("dropped", "stale", 3, 2)]
    assert [orjson.loads(row[4])["scores"][0] for row in rows] == [0, 1]


def test_drops_are_reported_in_metrics_and_one_log_line(client: TestClient, caplog: pytest.LogCaptureFixture) -> None:
    start(client, starting_step=10, max_staleness=2)
    submit(client, sampled(3, 0), sampled(5, 1), sampled(7, 2), sampled(8, 3), sampled(None, 4))
    with caplog.at_level(logging.WARNING, logger="atroposlib.api"):
        assert scores(client.get("/batch").json()["batch"]) == [3]
    warnings = [r.getMessage() for r in caplog.records if "stale" in r.getMessage()]
    assert warnings == ["dropped 3 stale group(s): sampled 3-7 steps before step 10, over max_staleness 2"]
    client.get("/batch")
    text = client.get("/metrics").text
    assert 'atropos_dropped_groups_total{env="env_0",reason="stale"} 3.0' in text
    assert "atropos_served_staleness_steps_count 1.0" in text
    assert 'atropos_served_staleness_steps_bucket{le="2.0"} 1.0' in text
    assert 'atropos_served_staleness_steps_bucket{le="1.0"} 0.0' in text
    assert "atropos_served_unknown_version_total 1.0" in text


def test_large_groups_keep_their_version_through_the_validator_pool(make_client: Callable[..., TestClient]) -> None:
    client = pooled_client(make_client)
    start(client, starting_step=3, max_staleness=0)
    body = sampled(1, 0)
    body["tokens"] = [[7] * 3000 for _ in range(8)]
    body["masks"] = [[-100] + [7] * 2999 for _ in range(8)]
    submit(client, body, sampled(3, 1))
    assert scores(client.get("/batch").json()["batch"]) == [1]
    assert len(client.app.state.runtime().validators.live_workers()) == 1


# -- restarts -----------------------------------------------------------------------------
def test_versions_and_counts_survive_a_restart(tmp_path: Path, clock: FakeClock) -> None:
    with durable_server(tmp_path, clock) as client:
        start(client, max_staleness=1)
        submit(client, sampled(0, 0), sampled(None, 1), sampled(0, 2), sampled(1, 3))
        assert scores(client.get("/batch").json()["batch"]) == [0]
        assert scores(client.get("/batch").json()["batch"]) == [1]
        assert scores(client.get("/batch").json()["batch"]) == [3]  # step 2: group 2 dropped
        submit(client, sampled(0, 4), sampled(3, 5))
    with durable_server(tmp_path, clock) as client:
        status = client.get("/status").json()
        assert status["max_staleness"] == 1 and status["current_step"] == 3
        assert status["dropped_groups"] == {"stale": 1} and status["unknown_version_groups"] == 1
        assert scores(client.get("/batch").json()["batch"]) == [5]  # group 4's version 0 outlived the restart
        assert client.get("/status").json()["dropped_groups"] == {"stale": 2}
        client.post("/reset")
        assert client.get("/status").json()["dropped_groups"] == {}


def test_a_database_from_before_policy_versions_is_migrated(tmp_path: Path, clock: FakeClock) -> None:
    config = registration(8)  # stored before max_staleness existed
    db = sqlite3.connect(tmp_path / "state.sqlite3")
    db.executescript(OLD_ITEMS_TABLE)
    for key, value in (("config", config), ("started", True), ("step", 5), ("batch_counter", 5)):
        db.execute("INSERT INTO meta VALUES (?, ?)", (key, orjson.dumps(value)))
    payloads = [orjson.dumps(sampled(0, 0)), gzip.compress(orjson.dumps(sampled(5, 1))), orjson.dumps(sampled(0, 2))]
    for seq, payload in enumerate(payloads, start=1):
        state = "served" if seq == 3 else "queued"
        db.execute("INSERT INTO items (seq, pos, state, size, t, data) VALUES (?, ?, ?, 8, ?, ?)",
                   (seq, seq, state, clock(), payload))
    db.commit()
    db.close()
    with durable_server(tmp_path, clock) as client:
        status = client.get("/status").json()
        assert (status["max_staleness"], status["current_step"], status["queue_size"]) == (None, 5, 2)
        answer = client.post("/register?replace=true", json=registration(8, starting_step=5, max_staleness=1)).json()
        assert answer["registered"] == "replaced"
        assert scores(client.get("/batch").json()["batch"]) == [1]  # version 0 read back from the payload
        assert client.get("/status").json()["dropped_groups"] == {"stale": 1}


# -- registration mismatches ---------------------------------------------------------------
def test_mismatch_reports_both_values(client: TestClient) -> None:
    client.post("/register", json=registration(32, max_staleness=2))
    answer = client.post("/register", json=registration(64, max_staleness=3)).json()
    assert answer["config_mismatch"] == ["batch_size", "max_staleness"]
    assert answer["config_mismatch_values"] == {
        "batch_size": {"stored": 32, "requested": 64},
        "max_staleness": {"stored": 2, "requested": 3},
    }


def test_a_client_that_omits_max_staleness_joins_a_run_that_set_it(client: TestClient) -> None:
    client.post("/register", json=registration(32, max_staleness=2))
    for body in (registration(32), registration(32, max_staleness=None)):
        answer = client.post("/register", json=body).json()
        assert answer["registered"] == "existing"
        assert "config_mismatch" not in answer and "config_mismatch_values" not in answer
    assert client.get("/status").json()["max_staleness"] == 2


def test_setting_max_staleness_on_a_run_without_it_is_a_mismatch(client: TestClient) -> None:
    client.post("/register", json=registration(32))
    answer = client.post("/register", json=registration(32, max_staleness=4)).json()
    assert answer["config_mismatch_values"] == {"max_staleness": {"stored": None, "requested": 4}}
    assert client.get("/status").json()["max_staleness"] is None
