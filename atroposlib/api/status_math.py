"""The numbers `/status-env` reports, computed exactly as Atropos environments expect.

Environments throttle themselves with these values (backpressure, worker caps, stop
conditions), so the formulas match the reference's, with two documented changes: an
env with a negative weight ("ignore") gets weight 1.0 and adds nothing to the total,
and an all-zero weight total yields 1.0 instead of a crash.
"""

from __future__ import annotations

import math
from typing import Any, Optional

from atroposlib.api.queue import PendingStats
from atroposlib.wire import EnvRecord

MIN_ENV_WEIGHT = 0.01


def env_weight(envs: list[EnvRecord], requester: EnvRecord) -> float:
    """The requester's share of inference capacity, by context length times weight."""
    if requester.weight < 0:
        return 1.0
    total = sum(e.max_context_len * max(0.0, e.weight) for e in envs if e.connected)
    if total <= 0:
        return 1.0
    return max(MIN_ENV_WEIGHT, requester.max_context_len * requester.weight / total)


def unallocated_fraction(envs: list[EnvRecord]) -> float:
    reserved = sum(
        e.min_batch_allocation
        for e in envs
        if e.connected and e.min_batch_allocation is not None
    )
    return 1.0 - min(float(reserved), 1.0)


def status_for_env(
    envs: list[EnvRecord],
    requester_id: int,
    pending: PendingStats,
    batch_size: int,
    current_step: int,
) -> dict[str, Any]:
    """The `/status-env` response for `requester_id` (a valid index into `envs`)."""
    requester = envs[requester_id]
    max_group_size = max(1, pending.sizes.largest())
    own_sequences = pending.sequences_of(requester_id)
    env_group_size = max(1, requester.group_size, pending.largest_of(requester_id))
    reserved: dict[Optional[int], int] = {
        e.registered_id: int(batch_size * e.min_batch_allocation)
        for e in envs
        if e.connected and e.min_batch_allocation is not None
    }
    available = 0
    if max_group_size > 1:
        for env_id, counts in pending.by_env.items():
            if env_id == requester_id:
                continue
            whole_groups = math.ceil(counts.total / max_group_size) * max_group_size
            available += max(0, whole_groups - reserved.get(env_id, 0))
    return {
        "current_step": current_step,
        "queue_size": (own_sequences + available) // env_group_size,
        "unallocated_fraction": unallocated_fraction(envs),
        "self_queue_size": own_sequences // env_group_size,
        "max_group_size": max_group_size,
        "env_weight": env_weight(envs, requester),
    }
