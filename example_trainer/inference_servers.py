"""Remote inference servers: running vLLM servers the trainer did not start (on other
machines, e.g. the inference nodes of a Slurm job) that take each new checkpoint in place.

They are the bundled `vllm_api_server.py`, whose ``POST /reload_weights {"weights_path":
DIR}`` makes the engine read DIR. A server reads the folder itself, so it must see it at the
same path: the trainer's ``--save-path`` on a file system shared with the inference nodes.

`InferenceServers.from_config` gives the servers of ``--inference-server-urls`` or, with
``--slurm-inference-servers``, those the Slurm discovery of ``--slurm true`` environments
finds (`slurm_inference_urls`). Every request carries ``Authorization: Bearer
$ATROPOS_INFERENCE_API_KEY`` when that variable is set (the servers' ``--api-key``).
`check` makes sure, before training, that every server answers and can reload (its
``/bridge/info`` route, which only the bundled server has, accepts the key); `reload` hands
a checkpoint to all of them at once. Either raises one `InferenceServerError` naming every
server that failed and why.
"""

from __future__ import annotations

import asyncio
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Awaitable, Callable, Mapping, Optional
from urllib.parse import urlsplit, urlunsplit

import httpx

from atroposlib.envs.server_handling.slurm import SlurmDiscoveryError, slurm_inference_urls

if TYPE_CHECKING:
    from example_trainer.config import TrainingConfig

API_KEY_ENV = "ATROPOS_INFERENCE_API_KEY"
CHECK_TIMEOUT_S = 10.0
RELOAD_TIMEOUT_S = 600.0
MISSING_FOLDER = "no weights folder"  # how the bundled server's 404 for an unseen folder begins
SHARED_FOLDER_HINT = ("the checkpoint folder (--save-path) must be on a file system the inference nodes see, "
                      "at the same path")
BUNDLED_SERVER_HINT = "the servers must be the trainer's bundled example_trainer/vllm_api_server.py"
KEY_HINT = f"set {API_KEY_ENV} to the servers' --api-key"


class InferenceServerError(RuntimeError):
    """A remote inference server is not there, cannot reload weights, or refused them; the
    one-line message names each such server."""


def server_root(url: str) -> str:
    """``http://HOST:PORT`` (with any path prefix) of a server URL given with or without the
    OpenAI ``/v1`` that environments' base URLs end in. ValueError unless http(s) with a host."""
    parts = urlsplit(url.strip())
    try:
        parts.port  # noqa: B018 (raises ValueError for a port that is not a number in range)
    except ValueError:
        raise ValueError(f"{url!r} has no valid port") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"{url!r} is not an inference server URL (http://HOST:PORT)")
    path = parts.path.rstrip("/")
    path = path[:-len("/v1")] if path.endswith("/v1") else path
    return urlunsplit((parts.scheme, parts.netloc, path, "", ""))


@dataclass(frozen=True)
class Refusal:
    """Why one server failed a request, and what the user can do about it (may be empty)."""

    root: str
    reason: str
    hint: str = ""


def _reason(exc: httpx.HTTPError) -> str:
    return " ".join((str(exc) or type(exc).__name__).split())


def _detail(response: httpx.Response) -> str:
    """The server's own explanation (FastAPI's ``detail``), on one line and short."""
    try:
        body = response.json()
        detail = body.get("detail", response.text) if isinstance(body, dict) else response.text
    except ValueError:
        detail = response.text
    return " ".join(str(detail).split())[:300] or response.reason_phrase


def _combined(refusals: list[Refusal]) -> str:
    named = "; ".join(f"{refusal.root}: {refusal.reason}" for refusal in refusals)
    hints = list(dict.fromkeys(refusal.hint for refusal in refusals if refusal.hint))
    return named + (f" ({'; '.join(hints)})" if hints else "")


Ask = Callable[[httpx.AsyncClient, str], Awaitable[Optional[Refusal]]]


@dataclass(frozen=True)
class InferenceServers:
    """The running servers (roots ``http://HOST:PORT``) that take the trainer's checkpoints,
    and the bearer key they want (None: no key)."""

    roots: tuple[str, ...]
    api_key: Optional[str] = field(default=None, repr=False)  # kept out of logs and tracebacks

    @classmethod
    def from_config(cls, config: "TrainingConfig", environ: Optional[Mapping[str, str]] = None) -> "InferenceServers":
        """The servers `config` names; `environ` (default: this process's) holds the key and,
        with ``slurm_inference_servers``, the Slurm job. In a job of one node, or outside
        Slurm, discovery finds none and the configured URLs are used, as for environments."""
        environ = os.environ if environ is None else environ
        urls = list(config.inference_server_urls or [])
        if config.slurm_inference_servers:
            try:
                found = slurm_inference_urls(environ)
            except SlurmDiscoveryError as exc:
                raise InferenceServerError(f"--slurm-inference-servers: {exc}") from None
            urls = [server_root(url) for url in found] or urls
        if not urls:
            raise InferenceServerError(
                "--slurm-inference-servers: no inference nodes (not in a Slurm job of two or more nodes) and no "
                "--inference-server-urls to use instead")
        return cls(tuple(dict.fromkeys(urls)), environ.get(API_KEY_ENV) or None)

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    def check(self) -> None:
        """Raise `InferenceServerError` unless every server answers ``/health`` and would
        take weights (a reload route, and the key accepted)."""
        refusals = self._ask_all(self._readiness, CHECK_TIMEOUT_S)
        if refusals:
            raise InferenceServerError(f"{len(refusals)} of {len(self.roots)} inference servers cannot take the "
                                       f"trainer's weights: {_combined(refusals)}")

    def reload(self, weights: str, policy_version: int) -> float:
        """Make every server read the weights in the folder `weights` (sent as an absolute
        path), all at once, and report them as `policy_version` (the trainer step they are
        from); returns the seconds it took, or raises `InferenceServerError`."""
        folder = str(Path(weights).absolute())
        started = time.monotonic()

        async def reload_one(client: httpx.AsyncClient, root: str) -> Optional[Refusal]:
            try:
                response = await client.post(f"{root}/reload_weights",
                                             json={"weights_path": folder, "policy_version": policy_version})
            except httpx.HTTPError as exc:
                return Refusal(root, f"no answer ({_reason(exc)})")
            if response.status_code < 400:
                return None
            detail = _detail(response)
            if response.status_code == 404 and detail.startswith(MISSING_FOLDER):
                return Refusal(root, f"sees no folder {folder}", SHARED_FOLDER_HINT)
            return self._refusal(root, response, detail)

        refusals = self._ask_all(reload_one, RELOAD_TIMEOUT_S)
        if refusals:
            raise InferenceServerError(f"{len(refusals)} of {len(self.roots)} inference servers did not take the "
                                       f"weights in {folder}: {_combined(refusals)}")
        return time.monotonic() - started

    async def _readiness(self, client: httpx.AsyncClient, root: str) -> Optional[Refusal]:
        try:
            health = await client.get(f"{root}/health")
            if health.status_code != 200:
                return Refusal(root, f"/health answered {health.status_code}")
            # /bridge/info is the bundled server's, behind its key like /reload_weights; it changes nothing
            probe = await client.get(f"{root}/bridge/info")
        except httpx.HTTPError as exc:
            return Refusal(root, f"no answer ({_reason(exc)})", "start them first, or fix the URLs")
        return None if probe.status_code < 400 else self._refusal(root, probe, _detail(probe))

    def _refusal(self, root: str, response: httpx.Response, detail: str) -> Refusal:
        code = response.status_code
        if code == 401:
            reason = "refused the key in $" + API_KEY_ENV if self.api_key else f"wants a key, and {API_KEY_ENV} is unset"
            return Refusal(root, f"{reason} ({code})", KEY_HINT)
        if code in (404, 405):
            return Refusal(root, f"has no weight reload route ({code} for {response.request.url.path})",
                           BUNDLED_SERVER_HINT)
        return Refusal(root, f"{response.request.url.path} answered {code}: {detail}")

    def _ask_all(self, ask: Ask, timeout: float) -> list[Refusal]:
        """`ask` every server at once; the refusals, in the servers' order."""
        async def everyone() -> list[Optional[Refusal]]:
            async with httpx.AsyncClient(timeout=timeout, headers=self.headers) as client:
                return list(await asyncio.gather(*(ask(client, root) for root in self.roots)))

        return [refusal for refusal in asyncio.run(everyone()) if refusal is not None]
