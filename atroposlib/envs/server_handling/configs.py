"""Configuration models of inference servers and of the manager that routes to them."""

from __future__ import annotations

import logging
from typing import Literal, Optional
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, model_validator

ServerType = Literal["openai", "trl", "sglang", "vllm"]
# Server types whose chat and completion routes are OpenAI's, under /v1 (trl's are at the root).
OPENAI_ROUTES = ("openai", "vllm", "sglang")

log = logging.getLogger("atroposlib.envs")


class ServerBaseline(BaseModel):
    """Settings shared by inference servers whose addresses are discovered (no URL)."""

    model_config = ConfigDict(extra="ignore")

    timeout: int = Field(default=1200, description="Per-request timeout in seconds.")
    num_max_requests_at_once: int = Field(default=512, description="Concurrent training requests per server.")
    num_requests_for_eval: int = Field(default=64, description="Concurrent evaluation requests per server.")
    model_name: str = Field(default="default", description="Model name sent with every request.")
    rolling_buffer_length: int = Field(default=1000, description="Samples kept per request-time metric.")
    server_type: ServerType = Field(default="openai", description="Backend: openai, vllm, sglang or trl.")
    tokenizer_name: str = Field(
        default="none", description="Hugging Face tokenizer (id or folder) of the served model; 'none' uses model_name."
    )


class APIServerConfig(ServerBaseline):
    """One inference server."""

    api_key: Optional[str] = Field(default="", description="Bearer key sent to the server.")
    base_url: Optional[str] = Field(default="", description="OpenAI-style base URL, usually ending in /v1.")
    n_kwarg_is_ignored: bool = Field(
        default=False, description="The server ignores n (completions per request): send n separate requests instead."
    )
    health_check: bool = Field(default=True, description="Probe the server's health in the background.")

    @model_validator(mode="after")
    def _openai_routes_under_v1(self) -> "APIServerConfig":
        """A base URL with no path (``http://host:9001``) would send every request to a route
        the server does not have: OpenAI's routes are under ``/v1``, which is added (once, with
        a warning)."""
        if self.server_type in OPENAI_ROUTES and self.base_url and urlsplit(self.base_url).path in ("", "/"):
            fixed = self.base_url.rstrip("/") + "/v1"
            log.warning("base_url %s has no path: using %s (OpenAI-style routes live under /v1)", self.base_url, fixed)
            self.base_url = fixed
        return self


class ServerManagerConfig(BaseModel):
    """How requests are spread over inference servers."""

    model_config = ConfigDict(extra="ignore")

    slurm: bool = Field(
        default=False, description="Discover the inference servers from the Slurm job's nodes (see SLURM.md)."
    )
    testing: bool = Field(
        default=False, description="Use the built-in mock inference harness instead of real servers."
    )
    max_n_completions: int = Field(default=8, description="Split larger n into requests of at most this many.")
    proxy_url: Optional[str] = Field(
        default=None, description="URL of the ManagedServer proxy; null: $ATROPOS_PROXY_URL, if set."
    )
