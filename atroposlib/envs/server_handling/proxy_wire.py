"""Request and response shapes of the ManagedServer proxy, shared by its server and client."""

from __future__ import annotations

from typing import Any, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field

from atroposlib.envs.server_handling.configs import APIServerConfig


class ProxyBackends(BaseModel):
    """The proxy's configuration file (and the body of ``POST /setup``)."""

    model_config = ConfigDict(extra="ignore")

    model_name: str = "unknown"
    tokenizer_name: Optional[str] = None
    servers: list[APIServerConfig] = Field(min_length=1)

    def server_configs(self) -> list[APIServerConfig]:
        """The servers, with the file's tokenizer for those that name none."""
        tokenizer = self.tokenizer_name or self.model_name
        return [s if s.tokenizer_name != "none" else s.model_copy(update={"tokenizer_name": tokenizer})
                for s in self.servers]


class SessionCreate(BaseModel):
    tool_parser: Optional[str] = "hermes"
    track_tree: bool = False
    base_url: Optional[str] = None


class SessionInfo(BaseModel):
    uuid: str
    model_name: str
    tool_parser: Optional[str]
    base_url: Optional[str]
    created_at: float


class SessionSummary(BaseModel):
    uuid: str
    model_name: str
    base_url: Optional[str]
    created_at: float
    last_accessed: float
    num_nodes: int


class ProxyMessage(BaseModel):
    model_config = ConfigDict(extra="allow")

    role: str
    content: Optional[Union[str, list[Any]]] = None
    tool_calls: Optional[list[dict[str, Any]]] = None
    tool_call_id: Optional[str] = None
    name: Optional[str] = None


class ProxyChatRequest(BaseModel):
    """An OpenAI chat request as the proxy takes it; optional sampling settings pass through."""

    messages: list[ProxyMessage]
    max_tokens: int = Field(default=1024, ge=1)
    temperature: float = Field(default=1.0, ge=0.0)
    n: int = Field(default=1, ge=1, le=1024)
    stop: Optional[Union[str, list[str]]] = None
    tools: Optional[list[dict[str, Any]]] = None
    tool_choice: Optional[Union[str, dict[str, Any]]] = None
    top_p: Optional[float] = None
    top_k: Optional[int] = None
    min_p: Optional[float] = None
    seed: Optional[int] = None
    presence_penalty: Optional[float] = None
    frequency_penalty: Optional[float] = None
    logprobs: Optional[bool] = None

    def sampling_kwargs(self) -> dict[str, Any]:
        """The settings to forward to the backend (unset optional ones are left out)."""
        return self.model_dump(exclude={"messages"}, exclude_none=True)


class RenderedPrompt(BaseModel):
    prompt_text: str
    token_ids: list[int]
    num_tokens: int


class ProxyErrorBody(BaseModel):
    message: str
    type: Literal["invalid_request_error", "server_error", "authentication_error", "not_found_error"]
    code: Optional[Union[int, str]] = None
