"""The ordered queue of stored groups and the counters derived from it.

Entries carry only what packing and accounting need (size, env id, age, policy
version); payloads stay in the journal. Counters are updated on every change so that
status queries cost O(number of envs), never O(queue).
"""

from __future__ import annotations

from collections import Counter, OrderedDict, defaultdict
from dataclasses import dataclass
from typing import Iterable, Iterator, Optional


@dataclass(slots=True)
class Entry:
    """One stored group, as the server tracks it in memory."""

    seq: int
    size: int
    env_id: Optional[int]
    t: float
    expirations: int = 0
    # The weights that sampled the group (`atroposlib.policy_version`); None: unknown.
    policy_version: Optional[int] = None


class SizeCounts:
    """A multiset of group sizes that knows its largest member and its sum."""

    def __init__(self) -> None:
        self._counts: Counter[int] = Counter()
        self.total = 0

    def add(self, size: int) -> None:
        self._counts[size] += 1
        self.total += size

    def remove(self, size: int) -> None:
        self._counts[size] -= 1
        if not self._counts[size]:
            del self._counts[size]
        self.total -= size

    def largest(self) -> int:
        return max(self._counts, default=0)

    def distinct(self) -> set[int]:
        return set(self._counts)

    def __len__(self) -> int:
        return sum(self._counts.values())


class PendingStats:
    """Per-env sequence counts of every group not yet committed to a trainer (queued
    or leased): the inputs of the `/status-env` arithmetic."""

    def __init__(self) -> None:
        self.sizes = SizeCounts()
        self.by_env: defaultdict[Optional[int], SizeCounts] = defaultdict(SizeCounts)

    def add(self, entry: Entry) -> None:
        self.sizes.add(entry.size)
        self.by_env[entry.env_id].add(entry.size)

    def remove(self, entry: Entry) -> None:
        self.sizes.remove(entry.size)
        env = self.by_env[entry.env_id]
        env.remove(entry.size)
        if not len(env):
            del self.by_env[entry.env_id]

    def sequences_of(self, env_id: Optional[int]) -> int:
        env = self.by_env.get(env_id)
        return env.total if env else 0

    def largest_of(self, env_id: Optional[int]) -> int:
        env = self.by_env.get(env_id)
        return env.largest() if env else 0


class GroupQueue:
    """Groups waiting to be packed, oldest first; `pos` orders them durably."""

    def __init__(self) -> None:
        self._entries: OrderedDict[int, Entry] = OrderedDict()
        self.sizes = SizeCounts()
        # Known policy versions of the queued groups, so that finding stale ones costs
        # O(distinct versions) per batch instead of a pass over the queue.
        self._versions: Counter[int] = Counter()
        self._next_pos = 1
        self._head_pos = 0

    def __len__(self) -> int:
        return len(self._entries)

    def __iter__(self) -> Iterator[Entry]:
        return iter(self._entries.values())

    def oldest(self) -> Optional[Entry]:
        return next(iter(self._entries.values()), None)

    def oldest_version(self) -> Optional[int]:
        """The smallest known policy version among queued groups (None: none known)."""
        return min(self._versions, default=None)

    def _count_in(self, entry: Entry) -> None:
        self.sizes.add(entry.size)
        if entry.policy_version is not None:
            self._versions[entry.policy_version] += 1

    def append(self, entry: Entry) -> int:
        """Add at the tail; returns the entry's durable position."""
        self._entries[entry.seq] = entry
        self._count_in(entry)
        self._next_pos += 1
        return self._next_pos - 1

    def restore(self, entry: Entry, pos: int) -> None:
        """Re-add an entry read back from the journal (entries arrive in `pos` order)."""
        self._entries[entry.seq] = entry
        self._count_in(entry)
        self._next_pos = max(self._next_pos, pos + 1)
        self._head_pos = min(self._head_pos, pos - 1)

    def push_front(self, entries: list[Entry]) -> list[int]:
        """Put `entries` back at the head, keeping their order; returns their positions."""
        positions = list(range(self._head_pos - len(entries) + 1, self._head_pos + 1))
        self._head_pos -= len(entries)
        for entry in reversed(entries):
            self._entries[entry.seq] = entry
            self._entries.move_to_end(entry.seq, last=False)
            self._count_in(entry)
        return positions

    def holds(self, seqs: Iterable[int]) -> bool:
        """Whether every one of `seqs` is queued."""
        return all(seq in self._entries for seq in seqs)

    def take(self, seqs: Iterable[int]) -> list[Entry]:
        taken = [self._entries.pop(seq) for seq in seqs]
        for entry in taken:
            self.sizes.remove(entry.size)
            if entry.policy_version is not None:
                self._versions[entry.policy_version] -= 1
                if not self._versions[entry.policy_version]:
                    del self._versions[entry.policy_version]
        return taken

    def clear(self) -> None:
        self.__init__()
