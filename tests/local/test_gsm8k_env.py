"""environments/gsm8k_server.py: a rollout too short to train on is sampled again instead of
costing the whole group (which process and serve mode drop when it is short)."""

from __future__ import annotations

import asyncio
import importlib.util
from types import ModuleType, SimpleNamespace
from typing import Any

from tests.real_engine import ROOT


def _gsm8k() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gsm8k_server", ROOT / "environments" / "gsm8k_server.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _rollout(completion_tokens: int) -> dict[str, Any]:
    prompt = [-100] * 5
    return {"messages": [], "tokens": [1] * (5 + completion_tokens), "masks": prompt + [7] * completion_tokens,
            "logprobs": [], "finish_reason": "stop"}


def _collect(lengths_per_call: list[list[int]], group_size: int) -> tuple[list[int], list[dict[str, Any]]]:
    gsm8k = _gsm8k()
    calls: list[int] = []

    async def sample(item: dict[str, str], n: int) -> list[dict[str, Any]]:
        lengths = lengths_per_call[len(calls)]
        calls.append(n)
        assert len(lengths) == n
        return [_rollout(length) for length in lengths]

    async def score_group(rollouts: list[dict[str, Any]], gold: str) -> list[dict[str, Any]]:
        return rollouts

    env = SimpleNamespace(config=SimpleNamespace(group_size=group_size), _sample=sample, score_group=score_group)
    group, backlog = asyncio.run(gsm8k.GSM8kEnv.collect_trajectories(env, {"question": "q", "answer": "3"}))
    assert backlog == []
    return calls, group


def test_only_the_missing_rollouts_are_sampled_again() -> None:
    calls, group = _collect([[40, 3, 50, 0], [2, 30], [12]], group_size=4)
    assert calls == [4, 2, 1] and len(group) == 4
    assert all(sum(1 for m in rollout["masks"] if m != -100) >= 10 for rollout in group)


def test_a_full_group_costs_one_call_and_sampling_again_is_bounded() -> None:
    assert _collect([[40, 40]], group_size=2)[0] == [2]
    calls, group = _collect([[1, 40], [1], [1]], group_size=2)
    assert calls == [2, 1, 1] and len(group) == 1  # still short after two more tries: the group is dropped
