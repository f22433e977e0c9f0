"""A retried submission is stored once."""

from __future__ import annotations

from tests.conftest import group, start_run


def test_header_key_dedupes(client) -> None:
    start_run(client, 8)
    first = client.post("/scored_data", json=group(8, env_id=0), headers={"Idempotency-Key": "k1"}).json()
    again = client.post("/scored_data", json=group(8, env_id=0), headers={"Idempotency-Key": "k1"}).json()
    assert first == {"status": "received"} and again == {"status": "received", "duplicate": True}
    assert client.get("/status").json()["queue_size"] == 1


def test_body_submission_id_dedupes_per_list_element(client) -> None:
    start_run(client, 8)
    groups = [group(8, env_id=0, submission_id="a"), group(8, env_id=0, submission_id="b")]
    client.post("/scored_data_list", json=groups)
    again = client.post("/scored_data_list", json=groups + [group(8, env_id=0, submission_id="c")]).json()
    assert again["duplicates"] == 2
    assert client.get("/status").json()["queue_size"] == 3


def test_list_header_key_repeats_the_whole_answer(client) -> None:
    start_run(client, 8)
    headers = {"Idempotency-Key": "list-1"}
    first = client.post("/scored_data_list", json=[group(8), group(8)], headers=headers).json()
    again = client.post("/scored_data_list", json=[group(8), group(8)], headers=headers).json()
    assert again == {**first, "duplicate": True}
    assert client.get("/status").json()["queue_size"] == 2


def test_keys_expire_after_the_ttl(make_client, clock) -> None:
    client = make_client(idempotency_ttl=10)
    start_run(client, 8)
    client.post("/scored_data", json=group(8, submission_id="x"))
    clock.advance(11)
    client.get("/status")
    assert "duplicate" not in client.post("/scored_data", json=group(8, submission_id="x")).json()


def test_overlong_key_is_rejected(client) -> None:
    response = client.post("/scored_data", json=group(8), headers={"Idempotency-Key": "k" * 129})
    assert response.status_code == 422
