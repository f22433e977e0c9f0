"""`ServerManager`: spreads an environment's inference requests over its servers.

Requests go to the healthy server with the most free slots (training and evaluation
slots are counted separately). A request for more than ``max_n_completions`` choices is
split into chunks sent concurrently and merged, with choices renumbered 0..n-1.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import os
from contextlib import asynccontextmanager
from typing import Any, AsyncIterator, Optional, Union

from atroposlib.envs.server_handling.api_server import APIServer, health_client
from atroposlib.envs.server_handling.configs import APIServerConfig, ServerBaseline, ServerManagerConfig
from atroposlib.envs.server_handling.openai_server import OpenAIServer, merge_choices
from atroposlib.envs.server_handling.reasoning import ReasoningConfig
from atroposlib.envs.server_handling.server_harness import TESTING_RESPONSE, ServerHarness
from atroposlib.envs.server_handling.slurm import slurm_inference_urls

log = logging.getLogger("atroposlib.inference")

ServerConfigs = Union[ServerBaseline, APIServerConfig, list[APIServerConfig]]
LOCAL_PORTS = range(9004, 9008)

__all__ = [
    "APIServer", "APIServerConfig", "ReasoningConfig", "ServerBaseline", "ServerManager", "ServerManagerConfig",
    "slurm_inference_urls",
]


def backend_class(server_type: str) -> type[APIServer]:
    if server_type == "openai":
        return OpenAIServer
    if server_type == "vllm":
        from atroposlib.envs.server_handling.vllm_server import VLLMServer

        return VLLMServer
    if server_type == "sglang":
        from atroposlib.envs.server_handling.sglang_server import SGLangServer

        return SGLangServer
    if server_type == "trl":
        from atroposlib.envs.server_handling.trl_vllm_server import TrlVllmServer

        return TrlVllmServer
    raise ValueError(f"unknown server_type {server_type!r}: use openai, vllm, sglang or trl")


def server_setting(server: Any, name: str) -> Any:
    """The config field `name` of `server`, or None: stand-ins such as test harnesses may
    carry a config with only some of the fields."""
    return getattr(getattr(server, "config", None), name, None)


class ManagedServerUnsupported(NotImplementedError):
    """`managed_server()` was asked of a backend that returns no token ids (plain OpenAI):
    a configuration error, so `serve` and `process` stop at the first one instead of
    failing every rollout."""

class ServerManager:
    """Routes chat, completion and token requests across inference servers."""

    def __init__(
        self,
        configs: ServerConfigs,
        server_class: type[APIServer] = APIServer,
        slurm: bool = False,
        testing: bool = False,
        max_n_completions: int = 8,
        reasoning_config: Optional[ReasoningConfig] = None,
        proxy_url: Optional[str] = None,
        use_proxy: bool = False,
        tool_parser: Optional[str] = None,
    ) -> None:
        self.max_n_completions = max_n_completions
        self.reasoning_config = reasoning_config
        self.proxy_url = proxy_url or os.environ.get("ATROPOS_PROXY_URL")
        self.use_proxy = use_proxy or self.proxy_url is not None
        self.tool_parser = tool_parser
        if testing:
            harness = ServerHarness()
            harness.set_default_response(TESTING_RESPONSE)
            self.servers: list[Any] = [harness]
            return
        resolved = self._resolve_configs(configs, slurm)
        if inspect.isabstract(server_class):
            server_class = backend_class(resolved[0].server_type)
        self.servers = [server_class(c, reasoning_config) for c in resolved]

    @staticmethod
    def _resolve_configs(configs: ServerConfigs, slurm: bool) -> list[APIServerConfig]:
        if isinstance(configs, APIServerConfig):  # one server: as a list of one (discovery copies it)
            configs = [configs]
        if isinstance(configs, list):
            discovered = slurm_inference_urls() if slurm else []
            if not discovered:
                return list(configs)
            return [configs[0].model_copy(update={"base_url": url}, deep=True) for url in discovered]
        urls = (slurm_inference_urls() if slurm else []) or [f"http://localhost:{p}/v1" for p in LOCAL_PORTS]
        shared = configs.model_dump()
        return [APIServerConfig(**shared, base_url=url, api_key="x") for url in urls]

    # -- routing ------------------------------------------------------------------------
    def _free_slots(self, server: APIServer, training: bool) -> float:
        eval_free = max(0.0, server.eval_sem.free - server.eval_sem.min_val())
        if not training:
            return eval_free
        eval_running = server.eval_sem.free < server.eval_sem.max_val
        reserve = eval_free if eval_running else 0.0
        return max(0.0, (server.sem.free - server.sem.min_val()) - reserve)

    def pick_server(self, training: bool = True) -> APIServer:
        """The healthy server with the most free slots (training or evaluation); ties go to the first."""
        healthy = [s for s in self.servers if s.server_healthy] or self.servers
        return max(healthy, key=lambda s: (self._free_slots(s, training), -self.servers.index(s)))

    def server_at(self, base_url: str) -> APIServer:
        """The server with this base URL (a trailing ``/`` is ignored); ValueError if none."""
        wanted = base_url.rstrip("/")
        for server in self.servers:
            if str(server_setting(server, "base_url") or "").rstrip("/") == wanted:
                return server
        raise ValueError(f"no inference server at {base_url}")

    async def _route(self, method: str, kwargs: dict[str, Any]) -> Any:
        server = self.pick_server(kwargs.get("split", "train") == "train")
        return await getattr(server, method)(**kwargs)

    async def _split_n(self, method: str, kwargs: dict[str, Any]) -> list[Any]:
        n = int(kwargs.get("n") or 1)
        sizes = [self.max_n_completions] * (n // self.max_n_completions)
        if n % self.max_n_completions:
            sizes.append(n % self.max_n_completions)
        return await asyncio.gather(*(self._route(method, {**kwargs, "n": size}) for size in sizes))

    async def chat_completion(self, **kwargs: Any) -> Any:
        if int(kwargs.get("n") or 1) <= self.max_n_completions:
            return await self._route("chat_completion", kwargs)
        return merge_choices(await self._split_n("chat_completion", kwargs))

    async def completion(self, **kwargs: Any) -> Any:
        if int(kwargs.get("n") or 1) <= self.max_n_completions:
            return await self._route("completion", kwargs)
        return merge_choices(await self._split_n("completion", kwargs))

    async def tokens_and_logprobs_completion(self, **kwargs: Any) -> Any:
        if int(kwargs.get("n") or 1) <= self.max_n_completions:
            return await self._route("tokens_and_logprobs_completion", kwargs)
        chunks = await self._split_n("tokens_and_logprobs_completion", kwargs)
        return (
            chunks[0][0],
            [tokens for chunk in chunks for tokens in chunk[1]],
            [logprobs for chunk in chunks for logprobs in chunk[2]],
            [reason for chunk in chunks for reason in chunk[3]],
        )

    async def get_logprobs(self, **kwargs: Any) -> Any:
        return await self._route("get_logprobs", kwargs)

    async def unreachable(self) -> list[str]:
        """Base URLs of the servers that answer no health probe right now."""
        async with health_client([s.config.base_url for s in self.servers], timeout=5) as client:
            answers = await asyncio.gather(*(server._probe_health(client) for server in self.servers))
        return [str(s.config.base_url) for s, ok in zip(self.servers, answers) if not ok]

    def update_weight(self, weight: float) -> None:
        for server in self.servers:
            server.update_weight(weight)

    @asynccontextmanager
    async def dedicated_server(self) -> AsyncIterator[APIServer]:
        """Hold one training slot of the freest server, e.g. to keep a conversation on it."""
        server = self.pick_server(training=True)
        async with server.sem:
            yield server

    @asynccontextmanager
    async def managed_server(
        self, tokenizer: Any = None, base_url: Optional[str] = None, preserve_think_blocks: bool = False
    ) -> AsyncIterator[Any]:
        """A server that records token ids, masks and logprobs of every completion
        (`ManagedServer`); its state is reset when the block ends."""
        from atroposlib.envs.server_handling.managed_server import DummyManagedServer, ManagedServer

        if self.use_proxy:
            async with self._proxy_session(base_url) as proxied:
                try:
                    yield proxied
                finally:
                    proxied.reset()
            return
        server = self.server_at(base_url) if base_url is not None else self.pick_server(training=True)
        if isinstance(server, ServerHarness) and server.tokenizer is None:  # --testing: it answers in tokens too
            server.tokenizer = tokenizer
        if type(server) is OpenAIServer:  # plain OpenAI routes return no token ids
            if os.environ.get("ATROPOS_ALLOW_DUMMY_MANAGED_SERVER", "").lower() not in ("1", "true", "yes"):
                raise ManagedServerUnsupported(
                    "managed_server() needs token ids, which OpenAI endpoints do not return: pass "
                    "--openai.server_type vllm (or sglang), or set ATROPOS_ALLOW_DUMMY_MANAGED_SERVER=1 to get "
                    "dummy tokens (never train on them)"
                )
            log.warning("managed_server() on an OpenAI endpoint: dummy tokens, not for training")
            managed: Any = DummyManagedServer(server, tokenizer)
        else:
            managed = ManagedServer(server, tokenizer, tool_parser=self.tool_parser,
                                    preserve_think_blocks=preserve_think_blocks)
        try:
            yield managed
        finally:
            managed.reset()

    @asynccontextmanager
    async def _proxy_session(self, base_url: Optional[str]) -> AsyncIterator[Any]:
        """A session at the ManagedServer proxy, deleted when the block ends."""
        from atroposlib.envs.server_handling.proxy_client import create_proxy_session

        if not self.proxy_url:
            raise ValueError("use_proxy needs a proxy URL: pass proxy_url / --proxy_url or set ATROPOS_PROXY_URL")
        model_name = getattr(getattr(self.servers[0], "config", None), "model_name", "unknown")
        session = await create_proxy_session(self.proxy_url, base_url=base_url, tool_parser=self.tool_parser or "hermes",
                                             model_name=model_name)
        async with session:
            yield session

    async def close(self) -> None:
        for server in self.servers:
            await server.close()
