"""``--validation``: what ``strict`` refuses, ``warn`` accepts and counts, ``off`` lets by."""

from __future__ import annotations

import gzip
import json
from typing import Any, Callable

import orjson
import pytest
from fastapi.testclient import TestClient

from tests.api.test_validator_pool import big_group, pooled_client
from tests.conftest import group, registration, start_run

TEXT = {"Content-Type": "text/plain"}


def suspect_groups() -> dict[str, tuple[dict[str, Any], str]]:
    """reason -> (a group with exactly that quality problem, the field it names)."""
    empty = group(2)
    empty["tokens"][1], empty["masks"][1] = [], []
    negative = group(2)
    negative["tokens"][0][2] = -5
    negative["masks"][0][2] = -5
    huge = group(2)
    huge["tokens"][1][1] = huge["masks"][1][1] = 99_999_999_999
    label = group(2)
    label["masks"][1][2] = 7
    advantages = group(2, advantages=[[0.5] * 4, [0.5] * 3])
    return {
        "empty_sequence": (empty, "body.tokens.1"),
        "token_id_range": (negative, "body.tokens.0.2"),
        "token_id_range_huge": (huge, "body.tokens.1.1"),
        "mask_label": (label, "body.masks.1.2"),
        "aux_length": (advantages, "body.advantages.1"),
    }


@pytest.mark.parametrize("case", sorted(suspect_groups()))
def test_strict_refuses_each_suspect_group_naming_the_field(make_client: Callable[..., TestClient], case: str) -> None:
    body, field = suspect_groups()[case]
    client = make_client(validation="strict")
    response = client.post("/scored_data", json=body)
    assert response.status_code == 422, response.text
    assert response.json()["error"]["message"].startswith(field)
    listed = client.post("/scored_data_list", json=[group(2), body])
    assert listed.status_code == 422 and listed.json()["error"]["message"].startswith(field.replace("body", "body.1"))
    assert client.get("/status").json()["queue_size"] == 0


@pytest.mark.parametrize("case", sorted(suspect_groups()))
def test_warn_accepts_each_suspect_group_and_counts_it(make_client: Callable[..., TestClient], case: str) -> None:
    body, field = suspect_groups()[case]
    client = make_client()
    response = client.post("/scored_data", json=body).json()
    assert response["status"] == "received" and response["warnings"][0].startswith(field)
    reason = case.removesuffix("_huge")
    assert f'atropos_validation_warnings_total{{reason="{reason}"}} 1.0' in client.get("/metrics").text


@pytest.mark.parametrize("case", sorted(suspect_groups()))
def test_off_accepts_each_suspect_group_silently(make_client: Callable[..., TestClient], case: str) -> None:
    body, _ = suspect_groups()[case]
    client = make_client(validation="off")
    assert client.post("/scored_data", json=body).json() == {"status": "received"}
    assert "atropos_validation_warnings_total{" not in client.get("/metrics").text


def test_consistent_groups_pass_strict_including_multi_turn_masks(make_client: Callable[..., TestClient]) -> None:
    client = make_client(validation="strict")
    turns = {"tokens": [[5, 6, 7, 8, 9, 10]], "masks": [[-100, 6, 7, -100, -100, 10]], "scores": [1],
             "advantages": [[0.0] * 6], "inference_logprobs": [[1.0] * 6]}
    assert client.post("/scored_data", json=turns).json() == {"status": "received"}
    assert client.post("/scored_data", json=group(8)).json() == {"status": "received"}


def test_pooled_workers_report_the_same_problems(make_client: Callable[..., TestClient]) -> None:
    body = big_group()
    body["masks"][3][500] = 1
    strict = pooled_client(make_client, validation="strict")
    start_run(strict, 8)
    refused = strict.post("/scored_data", content=gzip.compress(orjson.dumps(body)),
                          headers={"Content-Encoding": "gzip", "Content-Type": "application/json"})
    assert refused.status_code == 422 and refused.json()["error"]["message"].startswith("body.masks.3.500")
    lenient = pooled_client(make_client)
    start_run(lenient, 8)
    accepted = lenient.post("/scored_data", json=body).json()
    assert accepted["status"] == "received" and accepted["warnings"][0].startswith("body.masks.3.500")


def test_sequences_longer_than_the_trainers_max_token_len(make_client: Callable[..., TestClient]) -> None:
    long_group = group(2, length=3000)
    strict = make_client(validation="strict")
    strict.post("/register", json=registration(2, max_token_len=2048))
    refused = strict.post("/scored_data", json=long_group)
    assert refused.status_code == 409 and refused.json()["error"]["code"] == "sequence_too_long"
    assert "body.tokens" in refused.json()["error"]["message"] and "2048" in refused.json()["error"]["message"]
    assert strict.get("/batch").json() == {"batch": None}
    assert strict.post("/scored_data", json=group(2, length=2048)).json() == {"status": "received"}
    lenient = make_client()
    lenient.post("/register", json=registration(2, max_token_len=2048))
    accepted = lenient.post("/scored_data", json=long_group).json()
    assert "max_token_len 2048" in accepted["warnings"][0]
    assert 'reason="sequence_too_long"' in lenient.get("/metrics").text


def test_content_type_must_be_json_in_strict(make_client: Callable[..., TestClient]) -> None:
    strict = make_client(validation="strict")
    for endpoint, body in (("/scored_data", group(2)), ("/register", registration())):
        refused = strict.post(endpoint, content=json.dumps(body), headers=TEXT)
        assert refused.status_code == 415, refused.text
        assert refused.json()["error"]["code"] == "unsupported_media_type"
        assert "Content-Type" in refused.json()["error"]["message"]
    assert 'atropos_rejected_total{reason="unsupported_media_type"} 2.0' in strict.get("/metrics").text
    assert strict.post("/register", json=registration()).status_code == 200
    vendor = {"Content-Type": "application/vnd.example+json; charset=utf-8"}
    assert strict.post("/scored_data", content=json.dumps(group(2)), headers=vendor).status_code == 200


def test_content_type_is_counted_in_warn_and_ignored_when_off(make_client: Callable[..., TestClient]) -> None:
    lenient = make_client()
    assert lenient.post("/register", content=json.dumps(registration()), headers=TEXT).status_code == 200
    assert lenient.post("/scored_data", content=json.dumps(group(2)), headers=TEXT).json()["status"] == "received"
    assert 'atropos_validation_warnings_total{reason="content_type"} 2.0' in lenient.get("/metrics").text
    off = make_client(validation="off")
    assert off.post("/scored_data", content=json.dumps(group(2)), headers=TEXT).status_code == 200


def test_warnings_are_logged_without_flooding(make_client: Callable[..., TestClient], caplog: pytest.LogCaptureFixture) -> None:
    client = make_client()
    body, _ = suspect_groups()["mask_label"]
    for _ in range(5):
        client.post("/scored_data", json=body)
    logged = [r.getMessage() for r in caplog.records if "validation warning (mask_label)" in r.getMessage()]
    assert len(logged) == 1 and "body.masks.1.2" in logged[0]
    assert 'atropos_validation_warnings_total{reason="mask_label"} 5.0' in client.get("/metrics").text


@pytest.mark.parametrize("endpoint, body, field", [
    ("/heartbeat-env", {"env_id": False}, "env_id"),
    ("/disconnect-env", {"env_id": "0"}, "env_id"),
    ("/register", registration(max_token_len="2048"), "max_token_len"),
    ("/register", registration(replace=0), "replace"),
    ("/register-env", {"max_token_length": 1, "desired_name": "x", "weight": True, "group_size": 2}, "weight"),
    ("/scored_data", group(2, scores=["1.0", 1.0]), "scores.0"),
    ("/scored_data", {**group(2), "tokens": [[True, 1, 1, 1], [2, 2, 2, 2]]}, "tokens.0.0"),
])
def test_wrong_json_types_are_refused_at_every_level(
    make_client: Callable[..., TestClient], endpoint: str, body: dict[str, Any], field: str
) -> None:
    for level in ("off", "warn", "strict"):
        response = make_client(validation=level).post(endpoint, json=body)
        assert response.status_code == 422, (level, response.text)
        assert response.json()["error"]["message"].startswith(f"body.{field}")


def test_whole_number_floats_are_integers(client: TestClient) -> None:
    assert client.post("/register", json=registration(8, max_token_len=2048.0, starting_step=0.0)).status_code == 200
    assert client.get("/info").json() == {"batch_size": 8, "max_token_len": 2048}
    accepted = client.post("/scored_data", content=b'{"tokens": [[1.0, 2.0]], "masks": [[-100, 2.0]], "scores": [1]}')
    assert accepted.json() == {"status": "received"}
    served = client.get("/latest_example").json()
    assert served["tokens"] == [[1, 2]] and isinstance(served["tokens"][0][0], int)
    assert client.post("/scored_data", content=b'{"tokens": [[1.5, 2]], "masks": [[-100, 2]], "scores": [1]}').status_code == 422
