"""`APIServer`: the common call protocol of every inference backend.

Each call overrides the request's model with the configured one, takes a slot of the
training or evaluation semaphore (``split="train"`` or anything else), waits while the
server is unhealthy (at most ``timeout`` seconds), retries failures three times with
randomised exponential back-off, and records its duration for the server metrics.
Completion calls also add their sampling parameters and the policy version the answer
reported to the open sampling record (`sampling_record`).
"""

from __future__ import annotations

import asyncio
import logging
import statistics
import time
from abc import ABC, abstractmethod
from collections import deque
from typing import Any, Awaitable, Callable, Optional

import httpx
from tenacity import AsyncRetrying, retry_if_exception, stop_after_attempt, wait_random_exponential

from atroposlib.envs.server_handling.configs import APIServerConfig
from atroposlib.envs.server_handling.reasoning import ReasoningConfig
from atroposlib.envs.server_handling.sampling_record import (
    oldest,
    record_completion,
    reported_versions,
    sampling_params,
)
from atroposlib.envs.server_handling.semaphore import AsyncSemWithAdaptiveWeight

log = logging.getLogger("atroposlib.inference")

HEALTH_INTERVAL_S = 5.0
ATTEMPTS = 3


class ServerUnavailable(RuntimeError):
    """The inference server stayed unhealthy for longer than its timeout."""


class ModelNotServed(RuntimeError):
    """The inference server answered 404 and does not serve the configured model name: every
    request would fail the same way, so the environment stops with this one line."""


def _status_of(exc: BaseException) -> Optional[int]:
    """The HTTP status of a failed request (openai's and httpx's errors), else None."""
    status = getattr(exc, "status_code", None)
    response = getattr(exc, "response", None)
    if status is None and response is not None:
        status = getattr(response, "status_code", None)
    return status if isinstance(status, int) else None


def _worth_retrying(exc: BaseException) -> bool:
    """Failures a second attempt may fix: not a cancellation, not a model the server lacks."""
    return isinstance(exc, Exception) and not isinstance(exc, ModelNotServed)


def root_url(base_url: str) -> str:
    """The server root: `base_url` without a trailing ``/v1``."""
    url = base_url.rstrip("/")
    return url[: -len("/v1")] if url.endswith("/v1") else url


def health_client(base_urls: list[Optional[str]], timeout: float) -> httpx.AsyncClient:
    """An HTTP client for health probes of `base_urls`; it loads the system's certificates
    (0.05-0.1 s on a small CPU, before the first request) only when one of them is https."""
    tls = any(str(url or "").startswith("https:") for url in base_urls)
    return httpx.AsyncClient(timeout=timeout, verify=tls)


class APIServer(ABC):
    """One inference server; subclasses implement the backend's wire format."""

    def __init__(self, config: APIServerConfig, reasoning_config: Optional[ReasoningConfig] = None) -> None:
        self.config = config
        self.reasoning_config = reasoning_config or ReasoningConfig()
        self.sem = AsyncSemWithAdaptiveWeight(config.num_max_requests_at_once)
        self.eval_sem = AsyncSemWithAdaptiveWeight(config.num_requests_for_eval)
        self.server_healthy = True
        self.check_task: Optional[asyncio.Task[None]] = None
        length = config.rolling_buffer_length
        self.request_timings: deque[float] = deque(maxlen=length)
        self.attempts_list: deque[int] = deque(maxlen=length)
        self.eval_request_timings: deque[float] = deque(maxlen=length)
        self.eval_attempts_list: deque[int] = deque(maxlen=length)

    # -- public calls ------------------------------------------------------------------
    async def chat_completion(self, **kwargs: Any) -> Any:
        if not kwargs.pop("skip_reasoning", False):
            self.reasoning_config.inject(kwargs, self.config.base_url)
        return await self._call(self._chat_completion_wrapper, kwargs)

    async def completion(self, **kwargs: Any) -> Any:
        kwargs.pop("skip_reasoning", None)
        return await self._call(self._completion_wrapper, kwargs)

    async def tokens_and_logprobs_completion(self, **kwargs: Any) -> Any:
        kwargs.pop("skip_reasoning", None)
        return await self._call(self._tokens_and_logprobs_completion_wrapper, kwargs)

    async def get_logprobs(self, **kwargs: Any) -> Any:
        kwargs.pop("skip_reasoning", None)
        return await self._call(self._get_logprobs_wrapper, kwargs, sampled=False)

    def update_weight(self, weight: float) -> None:
        self.sem.update_weight(weight)
        self.eval_sem.update_weight(weight)

    # -- backend hooks ---------------------------------------------------------------------
    @abstractmethod
    async def _chat_completion_wrapper(self, **kwargs: Any) -> Any: ...

    @abstractmethod
    async def _completion_wrapper(self, **kwargs: Any) -> Any: ...

    async def _tokens_and_logprobs_completion_wrapper(self, **kwargs: Any) -> Any:
        raise NotImplementedError(f"{type(self).__name__} does not return tokens and logprobs")

    async def _get_logprobs_wrapper(self, **kwargs: Any) -> Any:
        raise NotImplementedError(f"{type(self).__name__} does not implement get_logprobs (prompt scoring)")

    async def _probe_health(self, client: httpx.AsyncClient) -> bool:
        """One cheap health probe: the server's /health, else its model list."""
        root = root_url(self.config.base_url or "")
        for url in (f"{root}/health", f"{(self.config.base_url or '').rstrip('/')}/models"):
            try:
                if (await client.get(url, headers=self._auth_headers())).status_code < 400:
                    return True
            except httpx.HTTPError:
                continue
        return False

    def _auth_headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.config.api_key}"} if self.config.api_key else {}

    # -- protocol ------------------------------------------------------------------------------
    async def _call(self, wrapper: Callable[..., Awaitable[Any]], kwargs: dict[str, Any], sampled: bool = True) -> Any:
        """`wrapper(**kwargs)` under the protocol; a `sampled` call (a completion, not prompt
        scoring) is added to the open sampling record."""
        self._ensure_health_task()
        kwargs["model"] = self.config.model_name
        training = kwargs.pop("split", "train") == "train"
        sem = self.sem if training else self.eval_sem
        params = sampling_params(kwargs)
        versions: list[Optional[int]] = []
        started = time.monotonic()
        attempts = 0
        async for attempt in AsyncRetrying(
            stop=stop_after_attempt(ATTEMPTS), wait=wait_random_exponential(multiplier=1, max=10), reraise=True,
            retry=retry_if_exception(_worth_retrying),
        ):
            with attempt:
                attempts += 1
                await self._wait_until_healthy()
                async with sem:
                    # a fresh list per attempt: only the answers of the attempt that succeeded count
                    with reported_versions() as versions:
                        try:
                            result = await wrapper(**kwargs)
                        except Exception as exc:
                            if _status_of(exc) == 404:
                                await self._check_model_is_served()
                            raise
        (self.request_timings if training else self.eval_request_timings).append(time.monotonic() - started)
        (self.attempts_list if training else self.eval_attempts_list).append(attempts)
        if sampled:
            record_completion(params, oldest(versions))
        return result

    async def _check_model_is_served(self) -> None:
        """After a 404: `ModelNotServed` when the server's model list lacks the configured name
        (a server without a readable list says nothing, and the 404 is retried as before)."""
        url = f"{(self.config.base_url or '').rstrip('/')}/models"
        try:
            async with health_client([self.config.base_url], timeout=10) as client:
                listed = (await client.get(url, headers=self._auth_headers())).json()["data"]
            served = [str(model["id"]) for model in listed]
        except (httpx.HTTPError, ValueError, KeyError, TypeError):
            return
        if served and self.config.model_name not in served:
            raise ModelNotServed(f"the inference server at {self.config.base_url} serves {', '.join(served)}, not "
                                 f"{self.config.model_name!r}: pass --openai.model_name {served[0]}")

    async def _wait_until_healthy(self) -> None:
        deadline = time.monotonic() + self.config.timeout
        while not self.server_healthy:
            if time.monotonic() > deadline:
                raise ServerUnavailable(f"{self.config.base_url} unhealthy for {self.config.timeout} s")
            await asyncio.sleep(0.5)

    def _ensure_health_task(self) -> None:
        if self.check_task is None and self.config.health_check and self.config.base_url:
            self.check_task = asyncio.get_running_loop().create_task(self._health_loop())

    async def _health_loop(self) -> None:
        async with health_client([self.config.base_url], timeout=10) as client:
            while True:
                healthy = await self._probe_health(client)
                if healthy != self.server_healthy:
                    log.warning("inference server %s is %s", self.config.base_url, "back" if healthy else "unhealthy")
                self.server_healthy = healthy
                await asyncio.sleep(HEALTH_INTERVAL_S)

    # -- metrics -----------------------------------------------------------------------------
    def wandb_metrics(self, metrics_dict: Optional[dict[str, float]] = None, server_name: Optional[str] = None) -> dict[str, float]:
        """Add this server's request statistics to `metrics_dict` (W&B key names)."""
        metrics = metrics_dict if metrics_dict is not None else {}
        name = server_name or "server"
        for label, timings in (("request_time", self.request_timings), ("eval_request_time", self.eval_request_timings)):
            if timings:
                values = sorted(timings)
                metrics[f"server/{name}_{label}_avg"] = statistics.fmean(values)
                metrics[f"server/{name}_{label}_std"] = statistics.pstdev(values)
                metrics[f"server/{name}_{label}_99p"] = values[min(len(values) - 1, int(0.99 * len(values)))]
        if self.attempts_list:
            metrics[f"server/{name}_average_num_attempts"] = statistics.fmean(self.attempts_list)
        if self.eval_attempts_list:
            metrics[f"server/{name}_eval_retry_rate"] = statistics.fmean(a > 1 for a in self.eval_attempts_list)
        return metrics

    async def close(self) -> None:
        if self.check_task is not None:
            self.check_task.cancel()
            self.check_task = None
