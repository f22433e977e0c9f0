"""The groups a viewer can show, in the order they arrived, and the way more of them arrive.

A feed is shared by everyone looking at the app; each browser tab only keeps its position.
From a JSONL file every group is there from the start. From the API a feed grows on request:
by taking a whole leased batch (acknowledged once its groups are kept here, so a viewer
that stops mid-request gives the batch back), or, attached to a trainer's run, by peeking
at the group the API queued last, which takes nothing from the trainer.
"""

from __future__ import annotations

import itertools
import threading
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Optional

from atroposlib.cli.batch_source import ApiBatchSource, ToolRefused


@dataclass(frozen=True)
class Entry:
    """One group and where it came from ("batch 2", "latest example", a file name)."""

    group: dict[str, Any]
    origin: str


# A fetch returns the new entries (maybe none) and a line saying what happened.
Fetch = Callable[[], tuple[list[Entry], str]]


class GroupFeed:
    """Entries seen so far; `fetch_more` appends the next ones, one request at a time."""

    def __init__(self, entries: Iterable[Entry] = (), fetch: Optional[Fetch] = None) -> None:
        self._entries = list(entries)
        self._fetch = fetch
        self._lock = threading.Lock()  # the app answers each tab on its own thread

    def __len__(self) -> int:
        return len(self._entries)

    def __getitem__(self, index: int) -> Entry:
        return self._entries[index]

    @property
    def can_fetch(self) -> bool:
        return self._fetch is not None

    def largest_group(self) -> int:
        """The most rollouts in one group so far."""
        return max((_rollouts(entry.group) for entry in self._entries), default=0)

    def fetch_more(self) -> tuple[Optional[int], str]:
        """``(index of the first new entry or None, what happened)``."""
        if self._fetch is None:
            return None, "this viewer reads a file: every group is already here"
        with self._lock:
            try:
                new, message = self._fetch()
            except ToolRefused as err:
                return None, str(err)
            if not new:
                return None, message
            self._entries.extend(new)
            return len(self._entries) - len(new), message


def _rollouts(group: dict[str, Any]) -> int:
    return len(group.get("tokens") or group.get("messages") or [])


def batch_fetcher(source: ApiBatchSource, wait_seconds: float) -> Fetch:
    """Take the next leased batch (waiting up to `wait_seconds`), keep all its groups, ack it."""
    numbers = itertools.count(1)

    def fetch() -> tuple[list[Entry], str]:
        try:
            batch = source.next_batch(timeout=wait_seconds)
        except TimeoutError:
            return [], (f"no batch is ready after {wait_seconds:g} s (the API forms one when enough "
                        "groups are queued); try again")
        number = next(numbers)
        entries = [Entry(group, f"batch {number}") for group in batch.groups]
        source.ack(batch)
        return entries, f"took batch {number}: {len(entries)} groups"

    return fetch


def latest_example_fetcher(source: ApiBatchSource) -> Fetch:
    """Peek at ``GET /latest_example``; a group already shown is not added again."""
    shown: list[dict[str, Any]] = []

    def fetch() -> tuple[list[Entry], str]:
        example = source.latest_example()
        if example is None:
            return [], "the API has not queued a group yet"
        if shown and shown[-1] == example:
            return [], "no newer group since the last one shown"
        shown[:] = [example]
        return [Entry(example, "latest example")], "showing the group the API queued last"

    return fetch
