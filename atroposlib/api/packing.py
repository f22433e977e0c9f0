"""Choosing which queued groups form a batch.

Every picker takes the group sizes of the queue (oldest first) and returns the indices
of the groups to take, or ``None`` when no batch can be formed. A batch always holds
whole groups whose sizes sum exactly to the batch size.

* `pick_exact` and `pick_with_minimums` reproduce Atropos's selection rules exactly
  (the public helpers in `atroposlib.api.utils` are thin wrappers over them), but stop
  reading the queue as soon as the batch is complete and use index sets instead of the
  quadratic scans of the original, so the server can call them on long queues.
* `pick_fifo_subset` is the fallback the server uses when those rules starve: the
  oldest-first subset of groups that sums exactly to the target, found with a suffix
  subset-sum over bitsets in O(len(sizes)) big-integer operations.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Iterable, Mapping, Optional, Sequence


def _completed_buckets(sizes: Iterable[int], largest: int) -> Iterable[list[int]]:
    """Yield runs of indices of equal-sized groups that together make `largest` sequences.

    Groups are bucketed by size in queue order; a bucket is released (and emptied) when
    its sizes add up to `largest`. Sizes that do not divide `largest` never complete.
    """
    buckets: dict[int, list[int]] = defaultdict(list)
    for index, size in enumerate(sizes):
        bucket = buckets[size]
        bucket.append(index)
        if len(bucket) * size == largest:
            yield list(bucket)
            bucket.clear()


def pick_exact(
    sizes: Iterable[int], batch_size: int, largest: int, total: int
) -> Optional[list[int]]:
    """Atropos's homogeneous-bucket rule: whole buckets of `largest` sequences, in the
    order they complete, until exactly `batch_size` sequences are taken.

    `largest` is the largest group size in the whole queue and `total` its sequence
    count; both are passed in because the server keeps them up to date incrementally.
    """
    if total < batch_size:
        return None
    picked: list[int] = []
    taken = 0
    size_of: dict[int, int] = {}
    for bucket in _completed_buckets(_recording(sizes, size_of), largest):
        for index in bucket:
            picked.append(index)
            taken += size_of[index]
            if taken == batch_size:
                return picked
            if taken > batch_size:
                return None
    return None


def _recording(sizes: Iterable[int], size_of: dict[int, int]) -> Iterable[int]:
    """Pass sizes through while remembering each one by index (for lazy iterables)."""
    for index, size in enumerate(sizes):
        size_of[index] = size
        yield size


def pick_with_minimums(
    sizes: Sequence[int],
    env_ids: Sequence[Optional[int]],
    batch_size: int,
    minimums: Mapping[int, float],
) -> Optional[list[int]]:
    """Atropos's minimum-allocation rule.

    `minimums` maps connected env ids to their minimum share of a batch. Only groups
    with an env id are eligible, bucketed per env against the largest size in the queue.
    Each env first gets its share (scaled down when the shares overbook the batch), then
    the rest of the batch is filled with eligible groups in queue order.
    """
    if not sizes:
        return None
    if not minimums:
        return pick_exact(sizes, batch_size, max(sizes), sum(sizes))
    largest = max(sizes)
    packable_by_env: dict[int, list[int]] = defaultdict(list)
    queued_envs: set[int] = set()
    per_env_buckets: dict[tuple[int, int], list[int]] = defaultdict(list)
    for index, (size, env_id) in enumerate(zip(sizes, env_ids)):
        if env_id is None:
            continue
        queued_envs.add(env_id)
        bucket = per_env_buckets[(env_id, size)]
        bucket.append(index)
        if len(bucket) * size == largest:
            packable_by_env[env_id].extend(bucket)
            bucket.clear()

    quotas: dict[int, int] = {}
    for env_id, share in minimums.items():
        quota = int(batch_size * share)
        if quota > 0:
            if env_id not in queued_envs or not packable_by_env.get(env_id):
                return None
            quotas[env_id] = quota
    booked = sum(quotas.values())
    if booked > batch_size:
        scale = batch_size / booked
        for env_id in quotas:
            smallest = min(sizes[i] for i in packable_by_env[env_id])
            quotas[env_id] = max(smallest, int(quotas[env_id] * scale))

    picked: list[int] = []
    taken = 0
    for env_id, quota in quotas.items():
        env_taken = 0
        for index in packable_by_env[env_id]:
            if env_taken >= quota:
                break
            if taken + sizes[index] <= batch_size:
                picked.append(index)
                env_taken += sizes[index]
                taken += sizes[index]
    if taken < batch_size:
        chosen = set(picked)
        packable = {i for indices in packable_by_env.values() for i in indices}
        for index in range(len(sizes)):
            if index in chosen or index not in packable:
                continue
            if taken + sizes[index] <= batch_size:
                picked.append(index)
                taken += sizes[index]
            if taken == batch_size:
                break
    return picked if taken == batch_size else None


def _suffix_reachability(sizes: Sequence[int], target: int) -> list[int]:
    """reach[i] has bit s set iff some subset of sizes[i:] sums to s (s <= target)."""
    mask = (1 << (target + 1)) - 1
    reach = [0] * (len(sizes) + 1)
    reach[-1] = 1
    for i in range(len(sizes) - 1, -1, -1):
        reach[i] = (reach[i + 1] | (reach[i + 1] << sizes[i])) & mask
    return reach


def pick_fifo_subset(sizes: Sequence[int], target: int) -> Optional[list[int]]:
    """The oldest-first subset of groups whose sizes sum exactly to `target`.

    Walks the groups oldest first and keeps one whenever the groups after it can still
    complete the target, so the result prefers older data over newer at every position.
    """
    if target <= 0:
        return None
    reach = _suffix_reachability(sizes, target)
    if not (reach[0] >> target) & 1:
        return None
    picked: list[int] = []
    remaining = target
    for i, size in enumerate(sizes):
        if remaining == 0:
            break
        if 0 < size <= remaining and (reach[i + 1] >> (remaining - size)) & 1:
            picked.append(i)
            remaining -= size
    return picked


def subset_indices_summing_to(sizes: Sequence[int], target: int) -> list[int]:
    """Atropos's buffer rule: a greedy oldest-first pass, else the subset found by
    back-tracking a subset-sum table from the newest entry (ascending indices)."""
    if not sizes:
        return []
    picked: list[int] = []
    running = 0
    for index, size in enumerate(sizes):
        if running + size <= target:
            picked.append(index)
            running += size
            if running == target:
                return picked
    if target < 0:
        return []
    mask = (1 << (target + 1)) - 1
    prefix = [1]
    for size in sizes:
        prefix.append((prefix[-1] | (prefix[-1] << size)) & mask)
    if not (prefix[-1] >> target) & 1:
        return []
    picked = []
    remaining = target
    for i in range(len(sizes), 0, -1):
        size = sizes[i - 1]
        if remaining >= size and (prefix[i - 1] >> (remaining - size)) & 1:
            picked.append(i - 1)
            remaining -= size
    return sorted(picked)
