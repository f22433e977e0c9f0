"""Authentication, body limits, gzip handling and CORS."""

from __future__ import annotations

import gzip

import orjson

from tests.conftest import group, registration


def test_api_key_guards_everything_but_root_and_health(make_client) -> None:
    client = make_client(api_key="s3cret")
    assert client.get("/health").status_code == 200 and client.get("/").status_code == 200
    denied = client.get("/batch")
    assert denied.status_code == 401 and denied.headers["www-authenticate"] == "Bearer"
    assert denied.json()["error"]["code"] == "unauthorized"
    assert client.get("/batch", headers={"Authorization": "Bearer wrong"}).status_code == 401
    assert client.get("/metrics").status_code == 401
    ok = client.get("/batch", headers={"Authorization": "Bearer s3cret"})
    assert ok.status_code == 200


def test_api_key_from_environment_and_public_metrics(make_client, monkeypatch) -> None:
    monkeypatch.setenv("ATROPOS_API_KEY", "from-env")
    client = make_client(metrics_public=True)
    assert client.get("/info").status_code == 401
    assert client.get("/metrics").status_code == 200


def test_gzip_request_accepted_and_corrupt_gzip_is_400(client) -> None:
    body = gzip.compress(orjson.dumps(registration()))
    response = client.post("/register", content=body, headers={"Content-Encoding": "gzip", "Content-Type": "application/json"})
    assert response.status_code == 200
    bad = client.post("/scored_data", content=b"not gzip", headers={"Content-Encoding": "GZIP"})
    assert bad.status_code == 400
    assert bad.json()["error"] == {"code": "invalid_gzip", "message": "Invalid gzip payload", "details": {}}


def test_large_responses_are_gzipped_small_ones_not(client) -> None:
    client.post("/register", json=registration(8))
    client.get("/batch")
    client.post("/scored_data", json=group(8, length=200))
    small = client.get("/info", headers={"Accept-Encoding": "gzip"})
    assert "content-encoding" not in small.headers
    large = client.get("/batch", headers={"Accept-Encoding": "gzip"})
    assert large.headers["content-encoding"] == "gzip" and len(large.json()["batch"]) == 1


def test_body_and_decompression_limits(make_client) -> None:
    client = make_client(max_body_bytes=10_000, max_decompressed_bytes=50_000)
    big = orjson.dumps(group(8, length=2000))
    assert client.post("/scored_data", content=big).status_code == 413
    bomb = gzip.compress(b"[" + b"0," * 1_000_000 + b"0]")
    assert len(bomb) < 10_000
    response = client.post("/scored_data", content=bomb, headers={"Content-Encoding": "gzip"})
    assert response.status_code == 413 and response.json()["error"]["code"] == "payload_too_large"


def test_cors_is_off_by_default_and_on_for_listed_origins(make_client) -> None:
    plain = make_client()
    assert "access-control-allow-origin" not in plain.get("/info", headers={"Origin": "http://evil"}).headers
    allowed = make_client(cors_origins="http://ui.local")
    response = allowed.get("/info", headers={"Origin": "http://ui.local"})
    assert response.headers["access-control-allow-origin"] == "http://ui.local"


def test_non_finite_scores_are_rejected(client) -> None:
    body = orjson.dumps(group(2)).replace(b"[1.0,1.0]", b"[NaN,1.0]")
    response = client.post("/scored_data", content=body)
    assert response.status_code == 422
