"""Where the data tools and viewers get scored groups: a live trajectory API, or a JSONL file.

From the API a tool must never destroy or steal a training run's data. `ApiBatchSource`
therefore refuses (`ToolRefused`) to register when a trainer already has (unless forced, or
the trainer has made all its steps), wipes the run only when asked, and takes batches with
leases, so a batch the tool did not finish goes back to the queue; its leases are marked as
not trained on, so the run's training step stays where the trainer left it and no group is
dropped as stale on the tool's account. A `process` JSONL file (one group per line) needs no API.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

import requests

from atroposlib.trainer_api import AtroposApiError, BatchFeed, LeasedBatch, request, with_retries

TOOL_LEASE_SECONDS = 600.0
STEAL_WARNING = "taking batches would steal the trainer's data"


class ToolRefused(Exception):
    """The tool will not go on (one readable line); its command line exits with status 2."""


@dataclass
class Batch:
    """Groups taken together: the API's items or lines of a file; `batch_id` names the lease."""

    groups: list[dict[str, Any]]
    batch_id: Optional[str] = None
    lease: Optional[LeasedBatch] = field(default=None, repr=False)


def registration(batch_size: int, max_token_len: int, num_steps: int) -> dict[str, Any]:
    """The ``POST /register`` body a tool sends (Atropos's tools send these values)."""
    return {
        "wandb_group": "test", "wandb_project": "test", "batch_size": batch_size,
        "max_token_len": max_token_len, "checkpoint_dir": "checkpoints", "save_checkpoint_interval": 10,
        "starting_step": 0, "num_steps": num_steps,
    }


class ApiBatchSource:
    """Scored groups from the trajectory API at `api_url` (bearer token from ``ATROPOS_API_KEY``)."""

    def __init__(self, api_url: str, *, log: Callable[[str], None] = print,
                 lease_seconds: float = TOOL_LEASE_SECONDS) -> None:
        self.url = api_url.rstrip("/")
        self.log = log
        self.lease_seconds = lease_seconds
        self._feed: Optional[BatchFeed] = None

    def _get(self, path: str) -> Any:
        """One GET answered with JSON; unreachable or refusing servers are `ToolRefused`."""
        try:
            return request("GET", f"{self.url}{path}").json()
        except requests.ConnectionError:
            raise ToolRefused(f"cannot reach the trajectory API at {self.url} (start it with `run-api`, "
                              "or pass --api-url)") from None
        except requests.HTTPError as err:
            hint = ": set ATROPOS_API_KEY to the API's key" if err.response.status_code == 401 else ""
            raise ToolRefused(f"GET {self.url}{path} answered {err.response.status_code}{hint}") from None
        except (requests.RequestException, ValueError) as err:
            raise ToolRefused(f"GET {self.url}{path} failed: {err}") from None

    def trainer_registered(self) -> bool:
        """Whether a trainer (or another tool) has registered a run with the API."""
        status = self._get("/status")
        if isinstance(status, dict) and "registered" in status:
            return bool(status["registered"])
        return self._get("/info").get("batch_size", -1) != -1  # servers whose /status does not say

    def claim(self, registration: dict[str, Any], *, reset: bool = False, force: bool = False) -> None:
        """Register as the run's consumer; refuses when a trainer already has, unless `force`."""
        if self.trainer_registered() and self._tool_registered(registration):
            self.log(f"the run at {self.url} was registered by a dataset tool with these settings (an earlier run, "
                     "kept across an API restart): taking it over")
        elif self.trainer_registered() and self._run_finished():
            self.log(f"the training run at {self.url} has finished: taking the groups it left")
        elif self.trainer_registered():
            if not force:
                raise ToolRefused(f"a training run is registered at {self.url}; {STEAL_WARNING} "
                                  "(stop the trainer first, or pass --force to take batches anyway)")
            self.log(f"a training run is registered at {self.url}: taking its batches (--force)")
        if reset:
            self._reset()
        try:
            with_retries(lambda: request("POST", f"{self.url}/register", json=registration))
        except AtroposApiError as err:
            raise ToolRefused(str(err)) from None

    def _run_finished(self) -> bool:
        """Whether the registered run's trainer has made all its steps (``num_steps``)."""
        status = self._get("/status")
        steps = status.get("num_steps") if isinstance(status, dict) else None
        return isinstance(steps, int) and steps > 0 and status.get("current_step", 0) >= steps

    def _tool_registered(self, registration: dict[str, Any]) -> bool:
        """Whether the registered run is one a dataset tool made with `registration`'s settings
        (W&B group and project, batch size, token limit), not a trainer's."""
        info, wandb = self._get("/info"), self._get("/wandb_info")
        return (wandb.get("group"), wandb.get("project"), info.get("batch_size"), info.get("max_token_len")) == (
            registration["wandb_group"], registration["wandb_project"], registration["batch_size"],
            registration["max_token_len"])

    def _reset(self) -> None:
        try:
            request("POST", f"{self.url}/reset")
        except requests.HTTPError as err:
            if err.response.status_code not in (404, 405):
                raise ToolRefused(f"POST {self.url}/reset answered {err.response.status_code}") from None
            self._get_text("/reset_data")  # servers without POST /reset
        self.log(f"the run's data at {self.url} was reset (--reset)")

    def _get_text(self, path: str) -> str:
        try:
            return request("GET", f"{self.url}{path}").text
        except requests.RequestException as err:
            raise ToolRefused(f"GET {self.url}{path} failed: {err}") from None

    def next_batch(self, timeout: Optional[float] = None) -> Batch:
        """The next batch, leased; `TimeoutError` when none comes within `timeout` seconds."""
        if self._feed is None:
            self._feed = BatchFeed(self.url, max_prefetch_batches=1, lease_seconds=self.lease_seconds, trains=False,
                                   log=self.log)
        try:
            leased = self._feed.next(timeout)
        except AtroposApiError as err:
            raise ToolRefused(str(err)) from None
        return Batch(groups=leased.items, batch_id=leased.batch_id, lease=leased)

    def ack(self, batch: Batch) -> None:
        """The tool has what it needs from `batch`: the API may forget it."""
        if self._feed is not None and batch.lease is not None:
            self._feed.ack(batch.lease)

    def nack(self, batch: Batch) -> None:
        """Give `batch` back to the head of the API's queue."""
        if self._feed is not None and batch.lease is not None:
            self._feed.nack(batch.lease)

    def latest_example(self) -> Optional[dict[str, Any]]:
        """The group the API queued last, without taking it; None when there is none."""
        example = self._get("/latest_example")
        return example if isinstance(example, dict) and example.get("tokens") else None

    def close(self) -> None:
        """Stop leasing; batches taken but not acknowledged go back to the queue."""
        if self._feed is not None:
            self._feed.close()
            self._feed = None


class JsonlBatchSource:
    """Scored groups from a JSONL file such as ``env.py process`` writes (one group per line)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        if not self.path.is_file():
            raise FileNotFoundError(f"no JSONL file at {self.path}")

    def groups(self) -> Iterator[dict[str, Any]]:
        """Each line's group; `ValueError` naming the line that is not a group."""
        with self.path.open(encoding="utf-8") as lines:
            for number, line in enumerate(lines, start=1):
                if not line.strip():
                    continue
                try:
                    group = json.loads(line)
                except json.JSONDecodeError as err:
                    raise ValueError(f"{self.path}:{number} is not JSON ({err.msg})") from None
                if not isinstance(group, dict) or "scores" not in group or not (
                        "tokens" in group or "messages" in group):
                    raise ValueError(f"{self.path}:{number} is not a scored group (it needs scores, and tokens "
                                     "or messages)")
                yield group

    def batches(self, groups_per_batch: int) -> Iterator[Batch]:
        """The file's groups, `groups_per_batch` at a time."""
        chunk: list[dict[str, Any]] = []
        for group in self.groups():
            chunk.append(group)
            if len(chunk) == groups_per_batch:
                yield Batch(groups=chunk)
                chunk = []
        if chunk:
            yield Batch(groups=chunk)
