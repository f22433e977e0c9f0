"""The server's fallback packer: exact, oldest-first, and never misses a feasible batch."""

from __future__ import annotations

from itertools import combinations
from typing import Optional

from hypothesis import given, settings
from hypothesis import strategies as st

from atroposlib.api.packing import pick_exact, pick_fifo_subset


def brute_force_fifo_subset(sizes: list[int], target: int) -> Optional[list[int]]:
    """The lexicographically smallest index list summing to target (oldest data first)."""
    best = None
    for r in range(1, len(sizes) + 1):
        for combo in combinations(range(len(sizes)), r):
            if sum(sizes[i] for i in combo) == target and (best is None or list(combo) < best):
                best = list(combo)
    return best


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(1, 9), max_size=10), st.integers(1, 24))
def test_fallback_finds_the_oldest_exact_subset_whenever_one_exists(sizes: list[int], target: int) -> None:
    assert pick_fifo_subset(sizes, target) == brute_force_fifo_subset(sizes, target)


def test_fallback_packs_sizes_the_standard_rule_cannot() -> None:
    sizes = [3, 5]
    assert pick_exact(sizes, 8, largest=5, total=8) is None
    assert pick_fifo_subset(sizes, 8) == [0, 1]


def test_fallback_reports_impossible_targets() -> None:
    assert pick_fifo_subset([8, 8, 8], 12) is None
    assert pick_fifo_subset([], 4) is None


def test_pick_exact_reads_only_what_it_needs() -> None:
    consumed = []

    def sizes():
        for size in [8] * 1000:
            consumed.append(size)
            yield size

    assert pick_exact(sizes(), 16, largest=8, total=8000) == [0, 1]
    assert len(consumed) == 2
