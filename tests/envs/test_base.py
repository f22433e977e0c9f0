"""BaseEnv's bookkeeping: dropped groups are explained once and counted, evaluations are timed,
the tokenizer loads behind the first rollouts."""

from __future__ import annotations

import asyncio
import json
import logging
import threading
from pathlib import Path
from typing import Any, Optional

import pytest

from atroposlib.envs.base import (
    TOKENIZER_HEAD_START_S,
    APIServerConfig,
    BaseEnv,
    BaseEnvConfig,
)


class Scripted(BaseEnv):
    """Rollouts without a model: rollout i of a group scores i (or 0 for all with `same`)."""

    name = "scripted"

    def __init__(self, *args: Any, same: bool = False, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.same = same
        self.finished_at: list[int] = []
        self.counter = 0

    async def setup(self) -> None:
        pass

    async def get_next_item(self) -> dict[str, int]:
        return {"n": 1}

    async def collect_trajectory(self, item: Any) -> tuple[dict[str, Any], list[Any]]:
        self.counter += 1
        index = self.counter
        await asyncio.sleep(0.02 * (index % 4))
        return {"tokens": [1, 2, 3], "masks": [-100, 2, 3], "scores": 0.0 if self.same else float(index)}, []

    async def evaluate(self, *args: Any, **kwargs: Any) -> None:
        await asyncio.sleep(0.3)
        self.evaluate_log({"eval/accuracy": 1.0})


def make_env(tokenizer_dir: Path, tmp_path: Path, same: bool = False, env_class: Optional[type] = None, **config: Any) -> Scripted:
    settings = dict(tokenizer_name=str(tokenizer_dir), use_wandb=False, group_size=4, total_steps=2,
                    data_dir_to_save_evals=str(tmp_path / "evals"), ensure_scores_are_not_same=True)
    settings.update(config)
    server = APIServerConfig(base_url="http://127.0.0.1:9/v1", model_name="m", health_check=False)
    return (env_class or Scripted)(BaseEnvConfig(**settings), [server], same=same)


def test_equal_score_groups_are_explained_once_and_counted(
    tokenizer_dir: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    env = make_env(tokenizer_dir, tmp_path, same=True)

    async def three_groups() -> None:
        for _ in range(3):
            group, _ = await env.collect_trajectories({"n": 1})
            assert await env.handle_send_to_api(group, do_send_to_api=False) == []

    with caplog.at_level(logging.WARNING, logger="atroposlib.envs"):
        asyncio.run(three_groups())
    explained = [r.getMessage() for r in caplog.records if "same_scores" in r.getMessage()]
    assert len(explained) == 1 and "--env.ensure_scores_are_not_same false" in explained[0]
    assert env.skipped.summary() == "3 dropped (same_scores 3)"


def test_default_collect_trajectories_counts_each_rollout_as_it_finishes(tokenizer_dir: Path, tmp_path: Path) -> None:
    env = make_env(tokenizer_dir, tmp_path)
    seen: list[int] = []
    env.on_rollouts_finished = lambda count: seen.append(env.rollouts_finished)
    group, _ = asyncio.run(env.collect_trajectories({"n": 1}))
    assert seen == [1, 2, 3, 4] and len(group["tokens"]) == 4


def test_evaluation_time_is_the_wall_time_of_evaluate(tokenizer_dir: Path, tmp_path: Path) -> None:
    env = make_env(tokenizer_dir, tmp_path)
    asyncio.run(env.run_evaluation())
    metrics = json.loads((tmp_path / "evals" / "metrics.json").read_text())
    assert float(metrics["config_general"]["total_evaluation_time_seconds"]) >= 0.3


class AsyncHook(Scripted):
    """Atropos's style: an async add_rollouts_for_wandb that awaits the base class's."""

    async def add_rollouts_for_wandb(self, scored_data: Any, item: Any = None) -> None:
        await super().add_rollouts_for_wandb(scored_data, item)
        self.hooked = "async"


class PlainHook(Scripted):
    def add_rollouts_for_wandb(self, scored_data: Any, item: Any = None) -> None:
        self.hooked = "plain"


@pytest.mark.parametrize("env_class, expected", [(AsyncHook, "async"), (PlainHook, "plain")])
def test_add_rollouts_for_wandb_overrides_run_async_or_plain(env_class: type, expected: str, tokenizer_dir: Path,
                                                             tmp_path: Path) -> None:
    env = make_env(tokenizer_dir, tmp_path, env_class=env_class)

    async def one_group() -> list[Any]:
        group, _ = await env.collect_trajectories({"n": 1})
        return await env.handle_send_to_api(group, do_send_to_api=False)

    assert len(asyncio.run(one_group())) == 1
    assert env.hooked == expected
    assert len(env.rollouts_for_wandb) == (1 if expected == "async" else 0)


class AwaitsEvaluateLog(Scripted):
    """Atropos's eval environments ``await self.evaluate_log(...)``."""

    async def evaluate(self, *args: Any, **kwargs: Any) -> None:
        await self.evaluate_log({"eval/accuracy": 0.5}, samples=[{"answer": "4"}])


def test_evaluate_log_can_be_awaited_as_in_atropos(tokenizer_dir: Path, tmp_path: Path) -> None:
    env = make_env(tokenizer_dir, tmp_path, env_class=AwaitsEvaluateLog)
    asyncio.run(env.run_evaluation())
    metrics = json.loads((tmp_path / "evals" / "metrics.json").read_text())
    assert metrics["results"]["all"]["eval/accuracy"] == 0.5
    assert (tmp_path / "evals" / "samples.jsonl").exists()


def test_the_tokenizer_thread_gives_the_first_rollouts_a_head_start(tokenizer_dir: Path, tmp_path: Path) -> None:
    env = make_env(tokenizer_dir, tmp_path)
    seen = []

    def loading_or_loaded() -> bool:
        return env._tokenizer is not None or any(t.name == "tokenizer-loader" for t in threading.enumerate())

    async def start_rollouts() -> None:
        env.start_loading_tokenizer()
        await asyncio.sleep(0)
        seen.append(loading_or_loaded())
        await asyncio.sleep(TOKENIZER_HEAD_START_S + 0.1)
        seen.append(loading_or_loaded())

    asyncio.run(start_rollouts())
    assert seen == [False, True]
    assert env.tokenizer.encode("hello")
