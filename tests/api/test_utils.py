"""The public packing helpers keep Atropos's exact selection rules."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from atroposlib.api.utils import (
    find_groups_summing_to_target,
    grab_batch_with_minimum_allocations,
    grab_exact_from_heterogeneous_queue,
)


def items(*sizes: int, env_ids: tuple = ()) -> list[dict]:
    envs = list(env_ids) or [None] * len(sizes)
    return [{"tokens": [[k]] * size, "env_id": env, "k": k} for k, (size, env) in enumerate(zip(sizes, envs))]


def keys(batch: list[dict] | None) -> list[int] | None:
    return None if batch is None else [item["k"] for item in batch]


def test_find_groups_greedy_first() -> None:
    assert find_groups_summing_to_target(items(3, 1, 2, 2), 4) == [0, 1]


def test_find_groups_back_tracks_preferring_later_entries() -> None:
    assert find_groups_summing_to_target(items(3, 2, 2), 4) == [1, 2]
    assert find_groups_summing_to_target(items(1, 3, 3, 1), 4) == [0, 1]
    assert find_groups_summing_to_target(items(3, 3, 1, 3), 4) == [0, 2]
    assert find_groups_summing_to_target(items(3, 3, 2, 2), 4) == [2, 3]


def test_find_groups_impossible_or_empty() -> None:
    assert find_groups_summing_to_target([], 4) == []
    assert find_groups_summing_to_target(items(3, 3), 4) == []


def test_grab_exact_takes_submission_order() -> None:
    queue = items(8, 8, 8, 8, 8)
    batch, rest = grab_exact_from_heterogeneous_queue(queue, 32)
    assert keys(batch) == [0, 1, 2, 3] and keys(rest) == [4]


def test_grab_exact_combines_small_groups_into_largest_size() -> None:
    queue = items(4, 2, 8, 2, 4)
    batch, rest = grab_exact_from_heterogeneous_queue(queue, 16)
    assert keys(batch) == [2, 0, 4] and keys(rest) == [1, 3]


def test_grab_exact_never_uses_sizes_not_dividing_the_largest() -> None:
    batch, rest = grab_exact_from_heterogeneous_queue(items(3, 5, 8), 16)
    assert batch is None and len(rest) == 3


def test_grab_exact_needs_a_multiple_of_the_largest() -> None:
    batch, rest = grab_exact_from_heterogeneous_queue(items(8, 8), 12)
    assert batch is None and keys(rest) == [0, 1]


def test_minimum_allocation_reserves_share() -> None:
    queue = items(4, 4, 4, 4, 4, 4, env_ids=(0, 0, 0, 0, 1, 1))
    configs = [
        {"registered_id": 0, "connected": True, "min_batch_allocation": None},
        {"registered_id": 1, "connected": True, "min_batch_allocation": 0.5},
    ]
    batch, rest = grab_batch_with_minimum_allocations(queue, 16, configs)
    assert keys(batch) == [4, 5, 0, 1] and keys(rest) == [2, 3]


def test_minimum_without_items_blocks_and_disconnected_minimum_is_ignored() -> None:
    queue = items(4, 4, env_ids=(0, 0))
    configs = [
        {"registered_id": 0, "connected": True, "min_batch_allocation": None},
        {"registered_id": 1, "connected": True, "min_batch_allocation": 0.5},
    ]
    assert grab_batch_with_minimum_allocations(queue, 8, configs)[0] is None
    configs[1]["connected"] = False
    assert keys(grab_batch_with_minimum_allocations(queue, 8, configs)[0]) == [0, 1]


def test_overbooked_minimums_are_scaled() -> None:
    queue = items(2, 2, 2, 2, 2, 2, 2, 2, env_ids=(0, 1, 0, 1, 0, 1, 0, 1))
    configs = [
        {"registered_id": 0, "connected": True, "min_batch_allocation": 0.75},
        {"registered_id": 1, "connected": True, "min_batch_allocation": 0.75},
    ]
    batch, _ = grab_batch_with_minimum_allocations(queue, 8, configs)
    assert sum(len(b["tokens"]) for b in batch) == 8
    assert {b["env_id"] for b in batch} == {0, 1}


sizes_strategy = st.lists(st.sampled_from([1, 2, 4, 8]), max_size=25)


@settings(max_examples=200, deadline=None)
@given(sizes_strategy, st.sampled_from([4, 8, 16, 32]))
def test_batches_always_sum_exactly_and_partition_the_queue(sizes: list[int], batch_size: int) -> None:
    queue = items(*sizes)
    batch, rest = grab_exact_from_heterogeneous_queue(queue, batch_size)
    if batch is not None:
        assert sum(len(b["tokens"]) for b in batch) == batch_size
        assert sorted(keys(batch) + keys(rest)) == list(range(len(sizes)))
        assert keys(rest) == sorted(keys(rest))
