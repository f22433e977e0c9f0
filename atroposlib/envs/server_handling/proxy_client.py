"""`ProxyManagedServer`: the environment's handle on one ManagedServer proxy session.

It behaves like the in-process `ManagedServer` for chat requests and state: completions
go through ``{proxy}/{uuid}/v1/chat/completions``, tool calls are kept in the returned
objects, and the node cache is refreshed after every completion, so `get_state()` is
current inside the ``async with`` block. Third-party code can instead be pointed at
`get_url()` as an OpenAI base URL.

The proxy's `ManagedServer` writes how each node was sampled into its metadata
(``generation_params``, ``policy_version``); nodes new since the last fetch are added to the
environment's open sampling record, so groups built from proxy sessions are stamped like
in-process ones. Completions made through `get_url()` are recorded when the nodes are
fetched: at the latest when the ``async with`` block ends.
"""

from __future__ import annotations

import os
from collections import Counter
from typing import Any, Optional

import httpx
from openai.types.chat import ChatCompletion

from atroposlib.envs.server_handling.managed_server import GENERATION_PARAMS, SequenceNode
from atroposlib.envs.server_handling.proxy_wire import ProxyChatRequest, SessionCreate, SessionInfo
from atroposlib.envs.server_handling.sampling_record import record_completion
from atroposlib.policy_version import POLICY_VERSION_KEY, parse_version
from atroposlib.utils.io import parse_http_response

CHAT_FIELDS = set(ProxyChatRequest.model_fields)


def _auth_headers(api_key: Optional[str]) -> dict[str, str]:
    key = api_key if api_key is not None else os.environ.get("ATROPOS_PROXY_API_KEY")
    return {"Authorization": f"Bearer {key}"} if key else {}


async def _call(url: str, method: str, headers: dict[str, str], timeout: float,
                body: Optional[dict[str, Any]] = None) -> Any:
    async with httpx.AsyncClient(timeout=timeout, headers=headers) as client:
        return await parse_http_response(await client.request(method, url, json=body))


def _record_node(node: SequenceNode) -> None:
    """Add a node to the open sampling record, as the proxy's `ManagedServer` described it."""
    metadata = node.metadata or {}
    version = parse_version(metadata.get(POLICY_VERSION_KEY))
    record_completion(metadata.get(GENERATION_PARAMS) or {}, version, node.tokens)


class ProxyManagedServer:
    """One session of a ManagedServer proxy."""

    def __init__(self, proxy_url: str, session_uuid: str, model_name: str = "unknown",
                 base_url: Optional[str] = None, api_key: Optional[str] = None) -> None:
        self.proxy_url = proxy_url.rstrip("/")
        self.session_uuid = session_uuid
        self.model_name = model_name
        self.base_url = base_url
        self._headers = _auth_headers(api_key)
        self._nodes: list[SequenceNode] = []

    def get_url(self) -> str:
        """The OpenAI base URL of this session."""
        return f"{self.proxy_url}/{self.session_uuid}/v1"

    async def _request(self, method: str, path: str, timeout: float, body: Optional[dict[str, Any]] = None) -> Any:
        return await _call(f"{self.proxy_url}{path}", method, self._headers, timeout, body)

    async def chat_completion(self, **kwargs: Any) -> ChatCompletion:
        """An OpenAI chat completion through the session; the node cache is refreshed after it."""
        kwargs.setdefault("max_tokens", 1024)
        kwargs.setdefault("temperature", 1.0)
        kwargs.setdefault("n", 1)
        body = ProxyChatRequest.model_validate({k: v for k, v in kwargs.items() if k in CHAT_FIELDS and v is not None})
        payload = await self._request("POST", f"/{self.session_uuid}/v1/chat/completions", 300,
                                      body.model_dump(exclude_none=True))
        await self.fetch_state()
        return ChatCompletion.model_validate(payload)

    async def completion(self, **kwargs: Any) -> Any:
        raise NotImplementedError("the ManagedServer proxy serves chat completions only")

    def get_state(self) -> dict[str, Any]:
        """The session's nodes as of the last completion or `fetch_state()`."""
        return {"nodes": list(self._nodes)}

    async def fetch_state(self) -> dict[str, Any]:
        """Refresh the node cache from the proxy; new nodes go into the sampling record."""
        payload = await self._request("GET", f"/{self.session_uuid}/nodes", 30)
        known = Counter(tuple(node.tokens) for node in self._nodes)
        self._nodes = [SequenceNode.model_validate(node) for node in payload.get("nodes", [])]
        for node in self._nodes:
            if known[tuple(node.tokens)] > 0:  # cached before: recorded then
                known[tuple(node.tokens)] -= 1
            else:
                _record_node(node)
        return self.get_state()

    def reset(self) -> None:
        self._nodes = []

    async def cleanup(self) -> None:
        """Delete the session at the proxy (a session already gone is not an error);
        the nodes fetched so far stay readable."""
        try:
            await self._request("DELETE", f"/{self.session_uuid}", 30)
        except httpx.HTTPStatusError as exc:
            if exc.response.status_code != 404:
                raise

    async def __aenter__(self) -> "ProxyManagedServer":
        return self

    async def __aexit__(self, *exc_info: Any) -> None:
        try:
            await self.fetch_state()
        finally:
            await self.cleanup()


async def create_proxy_session(proxy_url: str, base_url: Optional[str] = None, tool_parser: str = "hermes",
                               track_tree: bool = False, model_name: str = "unknown",
                               api_key: Optional[str] = None) -> ProxyManagedServer:
    """Open a session at the proxy (pinned to the backend at `base_url` when given)."""
    request = SessionCreate(tool_parser=tool_parser, track_tree=track_tree, base_url=base_url)
    answer = await _call(f"{proxy_url.rstrip('/')}/sessions/create", "POST", _auth_headers(api_key), 30,
                         request.model_dump())
    info = SessionInfo.model_validate(answer)
    return ProxyManagedServer(proxy_url, info.uuid, info.model_name, info.base_url, api_key)
