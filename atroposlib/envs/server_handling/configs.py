"""Configuration models of inference servers and of the manager that routes to them."""

from __future__ import annotations

from typing import Literal, Optional

from pydantic import BaseModel, ConfigDict, Field

ServerType = Literal["openai", "trl", "sglang", "vllm"]


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
