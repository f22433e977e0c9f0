"""`/status-env` numbers equal a plain transcription of the documented formulas."""

from __future__ import annotations

import math
from typing import Optional

from hypothesis import given, settings
from hypothesis import strategies as st

from atroposlib.api.queue import Entry, PendingStats
from atroposlib.api.status_math import MIN_ENV_WEIGHT, status_for_env
from atroposlib.wire import EnvRecord


def transcription(envs: list[dict], requester: int, queue: list[tuple[int, Optional[int]]], batch_size: int, step: int) -> dict:
    """The spec's formulas, computed directly over the whole queue."""
    me = envs[requester]
    total = sum(e["ctx"] * max(0, e["weight"]) for e in envs if e["connected"])
    if me["weight"] < 0:
        weight = 1.0
    elif total <= 0:
        weight = 1.0
    else:
        weight = max(MIN_ENV_WEIGHT, me["ctx"] * me["weight"] / total)
    unallocated = 1 - min(sum(e["min"] for e in envs if e["connected"] and e["min"] is not None), 1.0)
    max_group = max([1] + [size for size, _ in queue])
    own = sum(size for size, env in queue if env == requester)
    env_group = max([1, me["group_size"]] + [size for size, env in queue if env == requester])
    min_seq = {i: int(batch_size * e["min"]) for i, e in enumerate(envs) if e["connected"] and e["min"] is not None}
    others: dict = {}
    for size, env in queue:
        if env != requester:
            others[env] = others.get(env, 0) + size
    available = 0
    if max_group > 1:
        available = sum(max(0, math.ceil(n / max_group) * max_group - min_seq.get(k, 0)) for k, n in others.items())
    return {
        "current_step": step, "queue_size": (own + available) // env_group,
        "unallocated_fraction": unallocated, "self_queue_size": own // env_group,
        "max_group_size": max_group, "env_weight": weight,
    }


env_strategy = st.fixed_dictionaries({
    "ctx": st.sampled_from([256, 512, 1024, 4096]),
    "weight": st.sampled_from([-1.0, 0.0, 0.5, 1.0, 2.0]),
    "connected": st.booleans(),
    "min": st.sampled_from([None, 0.0, 0.1, 0.25, 0.6]),
    "group_size": st.sampled_from([1, 2, 4, 8]),
})


@settings(max_examples=300, deadline=None)
@given(
    st.lists(env_strategy, min_size=1, max_size=4),
    st.lists(st.tuples(st.sampled_from([1, 2, 3, 4, 8]), st.sampled_from([None, 0, 1, 2, 3, 7])), max_size=30),
    st.sampled_from([8, 16, 32, 64]),
    st.data(),
)
def test_status_env_matches_formulas(envs: list[dict], queue: list, batch_size: int, data: st.DataObject) -> None:
    requester = data.draw(st.integers(0, len(envs) - 1))
    records = [
        EnvRecord(registered_id=i, desired_name="e", real_name=f"e_{i}", max_context_len=e["ctx"],
                  weight=e["weight"], group_size=e["group_size"], min_batch_allocation=e["min"],
                  connected=e["connected"], last_update=0.0)
        for i, e in enumerate(envs)
    ]
    pending = PendingStats()
    for seq, (size, env) in enumerate(queue):
        pending.add(Entry(seq, size, env, 0.0))
    assert status_for_env(records, requester, pending, batch_size, 5) == transcription(envs, requester, queue, batch_size, 5)


def test_two_envs_share_by_context_length() -> None:
    records = [
        EnvRecord(registered_id=i, desired_name="e", real_name=f"e_{i}", max_context_len=ctx, weight=1.0,
                  group_size=8, last_update=0.0)
        for i, ctx in enumerate([512, 1024])
    ]
    status = status_for_env(records, 0, PendingStats(), 32, 0)
    assert status["env_weight"] == 1 / 3
    assert status["unallocated_fraction"] == 1.0 and isinstance(status["unallocated_fraction"], float)
