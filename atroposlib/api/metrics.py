"""Prometheus metrics of one API server (a private registry per app instance)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class ApiMetrics:
    """Counters are bumped where events happen; gauges are filled in at scrape time."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.current_step = Gauge("atropos_current_step", "Batches committed to a trainer", registry=r)
        self.queue_groups = Gauge("atropos_queue_groups", "Groups queued or leased", registry=r)
        self.queue_sequences = Gauge(
            "atropos_queue_sequences", "Sequences queued or leased", ["env"], registry=r
        )
        self.buffer_sequences = Gauge(
            "atropos_buffer_sequences", "Sequences in mixed-size buffers", ["env"], registry=r
        )
        self.env_connected = Gauge("atropos_env_connected", "1 if the env is live", ["env"], registry=r)
        self.lease_outstanding = Gauge("atropos_lease_outstanding", "Unacknowledged leases", registry=r)
        self.unpackable = Gauge(
            "atropos_unpackable", "1 when queued groups can never sum to the batch size", registry=r
        )
        self.dead_letter_groups = Gauge(
            "atropos_dead_letter_groups", "Groups dead-lettered after repeated lease expiry", registry=r
        )
        self.buffer_flushed = Counter(
            "atropos_buffer_flushed_total", "Buffered groups queued as they were", ["env"], registry=r
        )
        self.submissions = Counter(
            "atropos_submissions_total", "Groups submitted", ["env", "status"], registry=r
        )
        self.rejected = Counter("atropos_rejected_total", "Rejected requests", ["reason"], registry=r)
        self.validation_warnings = Counter(
            "atropos_validation_warnings_total",
            "Validation problems accepted with a warning (--validation warn)", ["reason"], registry=r,
        )
        self.batches_served = Counter(
            "atropos_batches_served_total", "Batches handed out", ["mode"], registry=r
        )
        self.lease_expired = Counter("atropos_lease_expired_total", "Leases that expired", registry=r)
        self.batch_wait = Histogram(
            "atropos_batch_wait_seconds",
            "Age of the oldest group when its batch formed",
            buckets=(0.1, 0.5, 1, 5, 15, 60, 300, 900, 3600),
            registry=r,
        )
        self.min_allocation_waived = Counter(
            "atropos_min_allocation_waived_total",
            "Batches formed by the fallback packer without honouring minimum allocations",
            registry=r,
        )
        self.dropped_groups = Counter(
            "atropos_dropped_groups_total", "Queued groups dropped unserved", ["env", "reason"], registry=r
        )
        self.served_staleness = Histogram(
            "atropos_served_staleness_steps",
            "Trainer steps between a committed group's sampling weights and the step it trains",
            buckets=(0, 1, 2, 3, 4, 6, 8, 12, 16, 32, 64),
            registry=r,
        )
        self.served_unknown_version = Counter(
            "atropos_served_unknown_version_total",
            "Groups committed to a trainer without a known policy version", registry=r,
        )
        self.request_bytes = Counter(
            "atropos_request_bytes_total", "Request body bytes received", ["endpoint"], registry=r
        )

    def render(self) -> bytes:
        return generate_latest(self.registry)
