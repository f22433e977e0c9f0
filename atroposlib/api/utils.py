"""Public batch-packing helpers, with Atropos's signatures and results.

Each takes queue items (dicts with at least ``tokens``; ``env_id`` where stated); the
*group size* of an item is ``len(item["tokens"])``. The selection logic lives in
`atroposlib.api.packing`, which the server uses directly.
"""

from __future__ import annotations

from typing import Any, Optional

from atroposlib.api.packing import (
    pick_exact,
    pick_with_minimums,
    subset_indices_summing_to,
)

Item = dict[str, Any]

__all__ = [
    "find_groups_summing_to_target",
    "grab_batch_with_minimum_allocations",
    "grab_exact_from_heterogeneous_queue",
]


def _group_size(item: Item) -> int:
    return len(item.get("tokens", []))


def _split(
    queue: list[Item], picked: Optional[list[int]]
) -> tuple[Optional[list[Item]], list[Item]]:
    if picked is None:
        return None, queue
    chosen = set(picked)
    return [queue[i] for i in picked], [
        item for i, item in enumerate(queue) if i not in chosen
    ]


def find_groups_summing_to_target(buffer: list[Item], target_size: int) -> list[int]:
    """Indices (ascending) of buffered groups whose sizes sum exactly to `target_size`,
    or ``[]`` when no subset does. Tries the oldest-first greedy choice before an
    exact subset search."""
    return subset_indices_summing_to([_group_size(g) for g in buffer], target_size)


def grab_exact_from_heterogeneous_queue(
    queue: list[Item], batch_size: int
) -> tuple[Optional[list[Item]], list[Item]]:
    """Take whole groups summing exactly to `batch_size`.

    Groups are first combined, per size and in queue order, into runs of the largest
    group size; runs are taken in the order they complete. Returns ``(batch, rest)``,
    or ``(None, queue)`` when no batch can be formed this way.
    """
    if not queue:
        return None, queue
    sizes = [_group_size(item) for item in queue]
    return _split(queue, pick_exact(sizes, batch_size, max(sizes), sum(sizes)))


def grab_batch_with_minimum_allocations(
    queue: list[Item], batch_size: int, env_configs: list[dict[str, Any]]
) -> tuple[Optional[list[Item]], list[Item]]:
    """Like `grab_exact_from_heterogeneous_queue`, but reserving for each connected env
    with a ``min_batch_allocation`` at least that share of the batch.

    `env_configs` entries carry ``registered_id``, ``connected`` and
    ``min_batch_allocation``. Returns ``(None, queue)`` when a minimum cannot be met.
    """
    if not queue:
        return None, queue
    minimums = {
        env["registered_id"]: env["min_batch_allocation"]
        for env in env_configs
        if env.get("connected", False) and env.get("min_batch_allocation") is not None
    }
    sizes = [_group_size(item) for item in queue]
    env_ids = [item.get("env_id") for item in queue]
    return _split(queue, pick_with_minimums(sizes, env_ids, batch_size, minimums))
