"""Configuration of the trajectory API server; `run-api`'s flags are generated from it."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal, Optional

import platformdirs
from pydantic import BaseModel, Field

MiB = 1024 * 1024


class ApiSettings(BaseModel):
    """Every knob of `run-api`. Field names map to flags: ``state_dir`` -> ``--state-dir``."""

    host: str = Field(
        default="127.0.0.1",
        description="Bind address. Loopback by default; use 0.0.0.0 for envs or trainers "
        "on other nodes (set --api-key then: binding a non-loopback address without a key "
        "logs a loud warning).",
    )
    port: int = Field(default=8000, ge=0, le=65535, description="Bind port.")
    reload: bool = Field(
        default=False, description="Development auto-reload (implies --ephemeral)."
    )
    api_key: Optional[str] = Field(
        default=None,
        description="Require 'Authorization: Bearer KEY' on every endpoint except GET /, "
        "GET /health and the documentation (/docs, /redoc, /openapi.json and their assets); "
        "others answer 401 (default: $ATROPOS_API_KEY).",
    )
    state_dir: Optional[Path] = Field(
        default=None,
        description="Folder of the durable state; a restart on the same port finds it "
        "without any flag (default: $ATROPOS_API_STATE_DIR, else "
        "<user data dir>/atroposlib/api/port-<port>).",
    )
    fresh: bool = Field(default=False, description="Discard the stored state at start-up.")
    ephemeral: bool = Field(
        default=False,
        description="Keep the state in memory only, as Atropos did (a restart loses everything).",
    )
    fsync: Literal["always", "batch", "off"] = Field(
        default="batch",
        description="'batch': a killed server loses nothing it acknowledged. 'always': also "
        "survives power loss (slower). 'off': leaves flushing to the OS.",
    )
    validation: Literal["off", "warn", "strict"] = Field(
        default="warn",
        description="Checks of submitted groups and request bodies beyond the JSON schema: "
        "'warn' refuses inconsistent token/mask/score lengths and accepts suspect groups "
        "(token ids, mask labels, array shapes, too long for the trainer, non-JSON "
        "Content-Type) with a warning; 'strict' refuses those too; 'off' checks the schema "
        "only. See CONFIG.md#validation-levels.",
    )
    validation_workers: Optional[int] = Field(
        default=None, ge=0, le=64,
        description="Processes that parse large submissions (16 KiB or more on the wire) off "
        "the event loop, started with the first one; 0 parses everything in the server process. "
        "Workers hold no state "
        "(default: one per usable CPU, at most 4; none on a single CPU).",
    )
    max_body_bytes: int = Field(
        default=256 * MiB, ge=1, description="Largest request body accepted (413 beyond)."
    )
    max_decompressed_bytes: int = Field(
        default=1024 * MiB, ge=1, description="Largest gunzipped request body; decompression "
        "stops at the cap (413), so a gzip bomb cannot exhaust memory."
    )
    cors_origins: Optional[str] = Field(
        default=None, description="Comma-separated origins allowed by CORS. CORS is off "
        "without it; '*' is allowed only without credentials."
    )
    env_timeout: float = Field(
        default=600.0, ge=0, description="Seconds without any signal (registration, status "
        "poll, submission, heartbeat) before an env is marked disconnected; a later signal "
        "reconnects it. 0 disables.",
    )
    buffer_ttl: float = Field(
        default=900.0, gt=0, description="Seconds a group may wait in a mixed-size buffer "
        "before it is queued as it is.",
    )
    max_buffered_sequences: Optional[int] = Field(
        default=None, ge=1, description="Sequences one env's buffer may hold before its "
        "oldest groups are queued as they are (default: 16 x the env's group size).",
    )
    starvation_grace: float = Field(
        default=30.0, ge=0, description="Seconds the oldest queued group may wait before the "
        "fallback packer forms a batch that Atropos's rules cannot.",
    )
    no_registration_gate: bool = Field(
        default=False,
        description="Let envs register before the trainer's first /batch (offline collection).",
    )
    disable_get_reset: bool = Field(
        default=False, description="Answer GET /reset_data with 405; POST /reset still works."
    )
    idempotency_ttl: float = Field(
        default=3600.0, gt=0, description="Seconds a submission id (Idempotency-Key header "
        "or submission_id field) is remembered (at most 1,000,000 ids)."
    )
    served_retention: float = Field(
        default=3600.0, ge=0, description="Seconds served batches stay in the served log "
        "(GET /batches/served) and settled leases are remembered."
    )
    max_redeliveries: int = Field(
        default=3, ge=1, description="Expired leases a group survives before it is "
        "dead-lettered (listed in /envs and /metrics)."
    )
    metrics_public: bool = Field(
        default=False, description="Serve /metrics without the API key."
    )
    log_level: Literal["debug", "info", "warning", "error"] = Field(
        default="info", description="Log level; 'debug' also logs every request."
    )
    log_json: bool = Field(
        default=False, description="Log one JSON object per line (ts, time, level, logger, message)."
    )

    def resolved_api_key(self) -> Optional[str]:
        return self.api_key or os.environ.get("ATROPOS_API_KEY") or None

    def resolved_state_dir(self) -> Optional[Path]:
        """Where durable state lives, or None for in-memory state."""
        if self.ephemeral or self.reload:
            return None
        if self.state_dir is not None:
            return self.state_dir
        from_env = os.environ.get("ATROPOS_API_STATE_DIR")
        if from_env:
            return Path(from_env)
        return Path(platformdirs.user_data_dir("atroposlib")) / "api" / f"port-{self.port}"

    def resolved_validation_workers(self) -> int:
        if self.validation_workers is not None:
            return self.validation_workers
        usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 2)
        return min(4, usable) if usable > 1 else 0

    def cors_origin_list(self) -> list[str]:
        return [o.strip() for o in (self.cors_origins or "").split(",") if o.strip()]
