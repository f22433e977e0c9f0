"""Progress of a generation job, in tokens, read from a vLLM server's ``/metrics``.

Groups finish together at the very end (every rollout of a group is one request, and all
groups run at once), so a bar of finished groups sits at zero and then jumps. Tokens move
all the time: the bar counts tokens generated since the job started against the job's
token budget, ``rollouts x max_tokens``, which shrinks as rollouts stop before their limit
(a finished rollout costs what it generated, an unfinished one at most ``max_tokens``).
So the bar's rate is the generation speed in tokens/s and its ETA is an upper bound.
"""

from __future__ import annotations

import threading
import time
from typing import Optional

import httpx
from prometheus_client.parser import text_string_to_metric_families
from pydantic import BaseModel
from tqdm.auto import tqdm

SAMPLES = {
    "vllm:generation_tokens_total": "generated_tokens",
    "vllm:request_generation_tokens_count": "finished_rollouts",
    "vllm:request_generation_tokens_sum": "finished_tokens",
    "vllm:num_requests_running": "running",
    "vllm:num_requests_waiting": "waiting",
}


class GenerationCounters(BaseModel):
    """vLLM's generation counters at one moment (summed over engines and models)."""

    generated_tokens: float = 0.0
    finished_rollouts: float = 0.0
    finished_tokens: float = 0.0
    running: float = 0.0
    waiting: float = 0.0

    def since(self, start: "GenerationCounters") -> "GenerationCounters":
        """Counts since `start` (the gauges `running` and `waiting` stay as they are)."""
        return GenerationCounters(generated_tokens=self.generated_tokens - start.generated_tokens,
                                  finished_rollouts=self.finished_rollouts - start.finished_rollouts,
                                  finished_tokens=self.finished_tokens - start.finished_tokens,
                                  running=self.running, waiting=self.waiting)


def parse_metrics(text: str) -> GenerationCounters:
    """The generation counters in a Prometheus text exposition from vLLM."""
    values: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            field = SAMPLES.get(sample.name)
            if field is not None:
                values[field] = values.get(field, 0.0) + sample.value
    return GenerationCounters(**values)


def read_counters(server_root: str, timeout: float = 5.0) -> Optional[GenerationCounters]:
    """The server's counters now, or None when it does not answer."""
    try:
        response = httpx.get(f"{server_root}/metrics", timeout=timeout)
        response.raise_for_status()
    except httpx.HTTPError:
        return None
    return parse_metrics(response.text)


def token_budget(job: GenerationCounters, planned_rollouts: int, max_tokens: int) -> int:
    """The most tokens the job can still total: what finished rollouts generated, plus
    ``max_tokens`` for every rollout not finished yet (planned or, when groups had to be
    generated again, in flight)."""
    unfinished = max(planned_rollouts - job.finished_rollouts, job.running + job.waiting, 0)
    return int(job.finished_tokens + unfinished * max_tokens)


def rollouts_postfix(finished: int, planned: int) -> str:
    """``rollouts 12/64``; rollouts beyond the plan (groups generated again, a server's own
    requests) are shown apart rather than as ``66/64``."""
    extra = finished - planned
    return f"rollouts {min(finished, planned)}/{planned}" + (f" (+{extra} extra)" if extra > 0 else "")


class TokenProgress:
    """A tqdm bar of generated tokens, refreshed from ``/metrics`` by a background thread
    while the job runs; a context manager. `job` holds the counts since the start."""

    def __init__(self, server_root: str, planned_rollouts: int, max_tokens: int, interval: float = 1.0) -> None:
        self.server_root = server_root
        self.planned_rollouts = planned_rollouts
        self.max_tokens = max_tokens
        self.interval = interval
        self.start = read_counters(server_root) or GenerationCounters()
        self.job = GenerationCounters()
        self.bar = tqdm(total=planned_rollouts * max_tokens, unit="tok", desc="generating", dynamic_ncols=True,
                        bar_format="{desc}: {percentage:3.0f}%|{bar}| {n_fmt}/{total_fmt} tokens "
                                   "[{elapsed}<{remaining}, {rate_fmt}{postfix}]")
        self._started = time.monotonic()
        self.seconds = 0.0
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._poll, name="token-progress", daemon=True)

    def write(self, line: str) -> None:
        """Print a line above the bar."""
        self.bar.write(line)

    def refresh(self) -> None:
        now = read_counters(self.server_root)
        if now is None:
            return
        self.job = now.since(self.start)
        self.bar.total = max(token_budget(self.job, self.planned_rollouts, self.max_tokens),
                             int(self.job.generated_tokens))
        self.bar.set_postfix_str(rollouts_postfix(int(self.job.finished_rollouts), self.planned_rollouts),
                                 refresh=False)
        self.bar.update(int(self.job.generated_tokens) - self.bar.n)

    def _poll(self) -> None:
        while not self._stopping.wait(self.interval):
            self.refresh()

    def __enter__(self) -> "TokenProgress":
        self._started = time.monotonic()
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stopping.set()
        self._thread.join()
        self.refresh()
        self.bar.close()
        self.seconds = time.monotonic() - self._started

    @property
    def tokens_per_second(self) -> float:
        """Generated tokens per second of wall time, over the job so far."""
        return self.job.generated_tokens / self.seconds if self.seconds > 0 else 0.0
