"""The environment's client of the trajectory API.

Submissions carry a ``submission_id`` so that retries are stored once. A submission the
API cannot take (transport errors or 5xx after three attempts) goes to the `Spool` and is
re-sent in order once the API is back; while the spool holds anything, new submissions
queue behind it. A submission the API refuses (4xx) is written to ``rejected.jsonl`` in
the spool folder, except when it refuses the key (401, 403: `ApiKeyRefused`): the data is
fine, so it is spooled and sent once the process runs with the right key. Nothing is dropped
silently.
"""

from __future__ import annotations

import asyncio
import gzip
import json
import logging
import os
import time
from pathlib import Path
from typing import Any

import httpx
import orjson
from tenacity import AsyncRetrying, retry_if_exception, stop_after_attempt, wait_random_exponential

from atroposlib.envs.serve_report import Throttle, duration
from atroposlib.envs.spool import Spool

log = logging.getLogger("atroposlib.envs")

GZIP_MIN_BYTES = 1024
RESEND_MAX_WAIT_S = 30.0
DISCONNECT_TIMEOUT_S = 5.0


class Rejected(Exception):
    """The API refused a request (4xx)."""

    def __init__(self, status: int, body: str) -> None:
        super().__init__(f"HTTP {status}: {body[:500]}")
        self.status = status
        self.body = body


class ApiKeyRefused(Rejected):
    """The API refused this process's key (401 or 403): it takes nothing until the key is right."""

    def __init__(self, status: int, body: str, base_url: str) -> None:
        super().__init__(status, body)
        self.args = (f"the trajectory API at {base_url} refuses this process's key (HTTP {status}): set "
                     "ATROPOS_API_KEY to the key run-api was started with (its --api-key or ATROPOS_API_KEY)",)


AUTH_FAILURES = (401, 403)


def awaits_trainer(status: int, body: str) -> bool:
    """Whether a refusal means only that no trainer has registered yet (an API restarted with
    ``--fresh``): what was refused is kept and sent again once one has."""
    return status == 409 and "not_registered" in body


def _retryable(exc: BaseException) -> bool:
    return isinstance(exc, httpx.TransportError) or (
        isinstance(exc, httpx.HTTPStatusError) and exc.response.status_code >= 500
    )


def encode_body(payload: Any) -> tuple[bytes, dict[str, str]]:
    """JSON, gzip-compressed when that is at least 1 KiB and makes it smaller."""
    body = orjson.dumps(payload)
    headers = {"Content-Type": "application/json"}
    if len(body) >= GZIP_MIN_BYTES:
        compressed = gzip.compress(body, compresslevel=6)
        if len(compressed) < len(body):
            return compressed, {**headers, "Content-Encoding": "gzip"}
    return body, headers


class TrajectoryApiClient:
    """One HTTP client for the life of the environment process."""

    def __init__(self, base_url: str, spool_dir: Path) -> None:
        api_key = os.environ.get("ATROPOS_API_KEY")
        self.http = httpx.AsyncClient(
            base_url=base_url.rstrip("/"), timeout=60,
            headers={"Authorization": f"Bearer {api_key}"} if api_key else {},
        )
        self.spool = Spool(spool_dir)
        self.rejected_path = spool_dir / "rejected.jsonl"
        self.items_resent = 0
        self.items_rejected = 0
        self._resend_lock = asyncio.Lock()

    async def close(self) -> None:
        await self.http.aclose()

    async def _request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        async for attempt in AsyncRetrying(
            stop=stop_after_attempt(3), wait=wait_random_exponential(multiplier=1, max=10),
            retry=retry_if_exception(_retryable), reraise=True,
        ):
            with attempt:
                response = await self.http.request(method, path, **kwargs)
                if response.status_code >= 500:
                    response.raise_for_status()
        if response.status_code in AUTH_FAILURES:
            raise ApiKeyRefused(response.status_code, response.text, str(self.http.base_url))
        if response.status_code >= 400:
            raise Rejected(response.status_code, response.text)
        return response

    async def get_json(self, path: str, body: Any = None) -> Any:
        kwargs: dict[str, Any] = {}
        if body is not None:  # Atropos servers read /status-env's env id from a GET body
            kwargs = {"content": orjson.dumps(body), "headers": {"Content-Type": "application/json"}}
        return (await self._request("GET", path, **kwargs)).json()

    async def post_json(self, path: str, payload: Any) -> Any:
        return (await self._request("POST", path, json=payload)).json()

    # -- registration ------------------------------------------------------------------
    async def wait_for_trainer(self, poll_s: float = 1.0) -> dict[str, Any]:
        """Wait until a trainer has registered (its batch size is known); return /info.
        Says so at once, then every 30 s with the time waited."""
        throttle = Throttle()
        while True:
            try:
                info = await self.get_json("/info")
                if info.get("batch_size", -1) != -1:
                    return info
                waiting = f"waiting for the trainer to register at {self.http.base_url}"
            except ApiKeyRefused:
                raise  # waiting would not change the key
            except (httpx.HTTPError, Rejected) as exc:
                waiting = f"waiting for the trajectory API at {self.http.base_url} ({exc or type(exc).__name__})"
            waited = throttle.due()
            if waited is not None:
                log.info("%s%s", waiting, f" ({duration(waited)} so far)" if waited >= 1 else "")
            await asyncio.sleep(poll_s)

    async def register_env(self, payload: dict[str, Any], poll_s: float = 1.0) -> dict[str, Any]:
        """Register, waiting while the API says the trainer has not started."""
        throttle = Throttle()
        while True:
            response = await self.post_json("/register-env", payload)
            if response.get("status") == "success":
                return response
            waited = throttle.due()
            if waited is not None:
                log.info("registering with the API: %s (%s so far); retrying", response.get("status"), duration(waited))
            await asyncio.sleep(poll_s)

    async def disconnect(self, env_id: int) -> None:
        """Tell the API this env leaves: one quick attempt, as the process is stopping."""
        try:
            response = await self.http.post("/disconnect-env", json={"env_id": env_id}, timeout=DISCONNECT_TIMEOUT_S)
            response.raise_for_status()
        except httpx.HTTPError as exc:
            log.warning("could not tell the API this env is leaving: %s", exc or type(exc).__name__)

    # -- submissions -----------------------------------------------------------------------
    async def submit(self, endpoint: str, payload: Any) -> bool:
        """Send groups; True when the API took them now, False when they were spooled or
        rejected (never lost)."""
        if len(self.spool):
            await self.resend_spooled()
        if len(self.spool):
            self.spool.append(endpoint, orjson.dumps(payload))
            return False
        return await self._deliver(endpoint, orjson.dumps(payload), payload)

    async def _deliver(self, endpoint: str, raw: bytes, payload: Any) -> bool:
        body, headers = encode_body(payload)
        try:
            await self._request("POST", endpoint, content=body, headers=headers)
            return True
        except ApiKeyRefused as exc:
            self.spool.append(endpoint, raw)
            log.error("%s; submission spooled to %s and sent once the key is right", exc, self.spool.folder)
            return False
        except Rejected as exc:
            if awaits_trainer(exc.status, exc.body):
                self.spool.append(endpoint, raw)
                log.warning("the API holds no run until a trainer registers; submission spooled to %s",
                            self.spool.folder)
                return False
            self._record_rejection(endpoint, exc.status, exc.body, raw)
            return False
        except httpx.HTTPError as exc:
            self.spool.append(endpoint, raw)
            log.warning("the API is unreachable (%s); submission spooled to %s", exc, self.spool.folder)
            return False
        except asyncio.CancelledError:
            # Stopping mid-delivery: keep it for the next start (the API stores a submission id once).
            self.spool.append(endpoint, raw)
            raise

    async def resend_spooled(self) -> int:
        """Re-send spooled payloads in order until one fails; returns how many went out."""
        sent = 0
        async with self._resend_lock:
            for path, endpoint, raw in list(self.spool.pending()):
                payload = orjson.loads(raw)
                body, headers = encode_body(payload)
                try:
                    response = await self.http.post(endpoint, content=body, headers=headers)
                except httpx.HTTPError:
                    break
                if (response.status_code >= 500 or response.status_code in AUTH_FAILURES
                        or awaits_trainer(response.status_code, response.text)):
                    break  # kept: the API is down, this process's key is wrong, or no trainer has registered
                if response.status_code >= 400:
                    self._record_rejection(endpoint, response.status_code, response.text, raw)
                path.unlink()
                sent += 1
        self.items_resent += sent
        return sent

    def _record_rejection(self, endpoint: str, status: int, response_body: str, raw: bytes) -> None:
        self.items_rejected += 1
        record = {"endpoint": endpoint, "status": status, "response_body": response_body,
                  "time": time.time(), "payload": json.loads(raw)}
        with open(self.rejected_path, "ab") as handle:
            handle.write(orjson.dumps(record) + b"\n")
        log.error("the API rejected a submission (HTTP %s); kept in %s", status, self.rejected_path)

    async def drain_spool(self, deadline_s: float) -> bool:
        """Keep re-sending until the spool is empty or `deadline_s` passes; True if empty.

        The deadline holds even for a request in flight to an API that takes connections but
        does not answer (one shutting down): the request is abandoned and its submission stays
        spooled; if the API did store it, its `submission_id` makes the next re-send a no-op."""
        try:
            await asyncio.wait_for(self._resend_until_empty(), timeout=deadline_s)
        except asyncio.TimeoutError:
            pass
        return not len(self.spool)

    async def _resend_until_empty(self) -> None:
        wait = 1.0
        while len(self.spool):
            if not await self.resend_spooled():
                await asyncio.sleep(wait)
                wait = min(wait * 2, RESEND_MAX_WAIT_S)
