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
        "on other nodes (set --api-key then).",
    )
    port: int = Field(default=8000, ge=0, le=65535, description="Bind port.")
    reload: bool = Field(
        default=False, description="Development auto-reload (implies --ephemeral)."
    )
    api_key: Optional[str] = Field(
        default=None,
        description="Require 'Authorization: Bearer KEY' on every endpoint but /, /health "
        "and the documentation (default: $ATROPOS_API_KEY).",
    )
    state_dir: Optional[Path] = Field(
        default=None,
        description="Folder of the durable state (default: $ATROPOS_API_STATE_DIR, else a "
        "folder per port under the user data directory).",
    )
    fresh: bool = Field(default=False, description="Discard stored state at start-up.")
    ephemeral: bool = Field(
        default=False, description="Keep everything in memory (not durable), as Atropos did."
    )
    fsync: Literal["always", "batch", "off"] = Field(
        default="batch",
        description="'batch' survives a killed server; 'always' also survives power loss.",
    )
    validation: Literal["off", "warn", "strict"] = Field(
        default="warn",
        description="Checks of submitted groups beyond the JSON schema: 'warn' refuses "
        "inconsistent token/mask/score lengths and accepts suspect groups (token ids, mask "
        "labels, array shapes, too long for the trainer, non-JSON Content-Type) with a "
        "warning; 'strict' refuses those too; 'off' checks the schema only (see CONFIG.md).",
    )
    validation_workers: Optional[int] = Field(
        default=None, ge=0, le=64,
        description="Processes that parse large submissions off the event loop (default: "
        "CPU count - 1, at most 4; 0 parses everything in the server process).",
    )
    max_body_bytes: int = Field(
        default=256 * MiB, ge=1, description="Largest request body accepted (413 beyond)."
    )
    max_decompressed_bytes: int = Field(
        default=1024 * MiB, ge=1, description="Largest gunzipped request body (413 beyond)."
    )
    cors_origins: Optional[str] = Field(
        default=None, description="Comma-separated origins allowed by CORS (off by default)."
    )
    env_timeout: float = Field(
        default=600.0, ge=0, description="Seconds of silence before an env is marked "
        "disconnected (0 disables).",
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
        default=30.0, ge=0, description="Seconds the oldest group may wait before the "
        "fallback packer forms batches the standard rules cannot.",
    )
    no_registration_gate: bool = Field(
        default=False, description="Let envs register before the trainer's first /batch."
    )
    disable_get_reset: bool = Field(
        default=False, description="Answer GET /reset_data with 405 (use POST /reset)."
    )
    idempotency_ttl: float = Field(
        default=3600.0, gt=0, description="Seconds a submission id is remembered."
    )
    served_retention: float = Field(
        default=3600.0, ge=0, description="Seconds served batches stay in the served log."
    )
    max_redeliveries: int = Field(
        default=3, ge=1, description="Expired leases a group survives before it is dead-lettered."
    )
    metrics_public: bool = Field(
        default=False, description="Serve /metrics without the API key."
    )
    log_level: Literal["debug", "info", "warning", "error"] = Field(
        default="info", description="Log level."
    )
    log_json: bool = Field(default=False, description="Log one JSON object per line.")

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
        return min(4, max(1, (os.cpu_count() or 2) - 1))

    def cors_origin_list(self) -> list[str]:
        return [o.strip() for o in (self.cors_origins or "").split(",") if o.strip()]
