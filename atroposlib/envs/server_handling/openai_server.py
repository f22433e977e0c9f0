"""`OpenAIServer`: any OpenAI-compatible endpoint (OpenAI, vLLM's or SGLang's OpenAI routes, ...).

Requests go through the client's raw-response routes, so the policy version a server
reports in its answer's headers reaches the sampling record; callers get the parsed
objects, as from ``create``.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Optional

import openai

from atroposlib.envs.server_handling.api_server import APIServer
from atroposlib.envs.server_handling.configs import APIServerConfig
from atroposlib.envs.server_handling.reasoning import ReasoningConfig
from atroposlib.envs.server_handling.resolve import resolve_openai_configs
from atroposlib.envs.server_handling.sampling_record import report_version, version_header

log = logging.getLogger("atroposlib.inference")

__all__ = ["APIServerConfig", "OpenAIServer", "resolve_openai_configs"]


class OpenAIServer(APIServer):
    """Chat and text completions through the ``openai`` client, with `n` emulated by
    parallel requests for providers that ignore it."""

    def __init__(self, config: APIServerConfig, reasoning_config: Optional[ReasoningConfig] = None) -> None:
        super().__init__(config, reasoning_config)
        plain_http = str(config.base_url or "").startswith("http:")
        self.openai = openai.AsyncOpenAI(
            api_key=config.api_key or "x", base_url=config.base_url or None, timeout=config.timeout,
            max_retries=0,  # APIServer retries; the client's own retries would multiply them
            # without TLS the system's certificates need not be loaded (a noticeable part of start-up)
            http_client=openai.DefaultAsyncHttpxClient(verify=False) if plain_http else None,
        )

    async def _chat_completion_wrapper(self, **kwargs: Any) -> Any:
        return await self._with_n(self.openai.chat.completions.with_raw_response.create, kwargs)

    async def _completion_wrapper(self, **kwargs: Any) -> Any:
        return await self._with_n(self.openai.completions.with_raw_response.create, kwargs)

    async def _with_n(self, create_raw: Any, kwargs: dict[str, Any]) -> Any:
        n = int(kwargs.get("n") or 1)
        if self.config.n_kwarg_is_ignored and n > 1:
            kwargs.pop("n", None)
            responses = await asyncio.gather(*(parsed(create_raw, kwargs) for _ in range(n)))
            return merge_choices(responses)
        response = await parsed(create_raw, kwargs)
        if len(response.choices) == n:
            return response
        if len(response.choices) != 1:
            raise ValueError(f"asked for {n} choices, the server returned {len(response.choices)}")
        log.warning("%s ignores n: sending %d separate requests from now on", self.config.base_url, n)
        self.config.n_kwarg_is_ignored = True
        kwargs.pop("n", None)
        more = await asyncio.gather(*(parsed(create_raw, kwargs) for _ in range(n - 1)))
        return merge_choices([response, *more])


async def parsed(create_raw: Any, kwargs: dict[str, Any]) -> Any:
    """One request through a raw-response route: the version in its headers is reported,
    the parsed response returned."""
    raw = await create_raw(**kwargs)
    report_version(version_header(raw))
    return raw.parse()


def merge_choices(responses: list[Any]) -> Any:
    """The first response carrying every response's choices, indexed 0..n-1."""
    merged = responses[0]
    merged.choices = [choice for response in responses for choice in response.choices]
    for index, choice in enumerate(merged.choices):
        choice.index = index
    return merged
