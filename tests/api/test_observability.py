"""Health, Prometheus metrics and structured logs."""

from __future__ import annotations

import logging

import orjson

from atroposlib.api.logs import JsonLineFormatter
from tests.conftest import group, start_run

REQUIRED_SERIES = [
    "atropos_current_step", "atropos_queue_groups", "atropos_queue_sequences", "atropos_buffer_sequences",
    "atropos_buffer_flushed_total", "atropos_env_connected", "atropos_submissions_total", "atropos_rejected_total",
    "atropos_batches_served_total", "atropos_lease_outstanding", "atropos_lease_expired_total",
    "atropos_batch_wait_seconds", "atropos_min_allocation_waived_total", "atropos_unpackable",
    "atropos_request_bytes_total", "atropos_dropped_groups_total", "atropos_served_staleness_steps",
    "atropos_served_unknown_version_total",
]


def test_metrics_expose_every_series_with_env_labels(client) -> None:
    start_run(client, 8, envs=(("gsm8k", 8),))
    client.post("/scored_data", json=group(8, env_id=0))
    client.post("/scored_data", json={"tokens": []})
    client.get("/batch")
    text = client.get("/metrics").text
    for series in REQUIRED_SERIES:
        assert f"# TYPE {series.removesuffix('_total')}" in text, series
    assert 'atropos_submissions_total{env="gsm8k_0",status="received"} 1.0' in text
    assert 'atropos_rejected_total{reason="validation_error"} 1.0' in text
    assert 'atropos_batches_served_total{mode="get"} 1.0' in text
    assert 'atropos_env_connected{env="gsm8k_0"} 1.0' in text


def test_health_is_open_and_summarises(client) -> None:
    health = client.get("/health").json()
    assert health["status"] == "ok" and health["registered"] is False and health["warnings"] == []
    start_run(client, 8)
    client.post("/scored_data", json=group(8, env_id=0))
    health = client.get("/health").json()
    assert (health["queue_groups"], health["queue_sequences"], health["envs_connected"]) == (1, 8, 1)


def test_json_log_lines() -> None:
    record = logging.LogRecord("atroposlib.api", logging.WARNING, __file__, 1, "env %s silent", ("x_0",), None)
    line = orjson.loads(JsonLineFormatter().format(record))
    assert line["level"] == "warning" and line["message"] == "env x_0 silent" and line["logger"] == "atroposlib.api"
