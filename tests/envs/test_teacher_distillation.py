"""Teacher distillation: groups carry the teacher's top-k logprobs, or none at all."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from atroposlib.envs.base import APIServerConfig
from atroposlib.envs.cli import resolve_settings
from atroposlib.envs.teacher_distillation_env import TeacherDistillationConfig, TeacherDistillationEnv
from tests.conftest import group


class Distilled(TeacherDistillationEnv):
    name = "distilled"

    async def get_next_item(self):
        return None


def make_env(tokenizer_dir: Path, teacher_url: str, timeout: int = 60, **config) -> Distilled:
    env_config = TeacherDistillationConfig(tokenizer_name=str(tokenizer_dir), teacher_enabled=True,
                                           ensure_scores_are_not_same=False, use_wandb=False, **config)
    teacher = APIServerConfig(base_url=teacher_url, server_type="vllm", tokenizer_name=str(tokenizer_dir),
                              timeout=timeout, health_check=False)
    return Distilled(env_config, APIServerConfig(base_url="http://unused/v1"), teacher_server_configs=teacher)


def test_groups_get_teacher_logprobs(tokenizer_dir: Path, inference_url: str) -> None:
    env = make_env(tokenizer_dir, inference_url, group_size=2)
    groups = [group(2, length=3), group(2, length=3, group_overrides={"skip_teacher_top_k": True})]
    kept = asyncio.run(env.handle_send_to_api(groups, do_send_to_api=False))
    assert kept[0]["distill_token_ids"] == [[[], [1], [1]], [[], [2], [2]]]
    assert kept[0]["distill_logprobs"][0] == [[], [-1.0], [-1.0]]
    assert kept[1]["distill_token_ids"] is None and kept[1]["distill_logprobs"] is None


def test_teacher_failure_leaves_no_partial_data(tokenizer_dir: Path) -> None:
    env = make_env(tokenizer_dir, "http://127.0.0.1:9/v1", timeout=2, group_size=2)
    kept = asyncio.run(env.handle_send_to_api([group(2, length=3)], do_send_to_api=False))
    assert kept[0]["distill_token_ids"] is None


def test_enabled_without_teacher_is_an_error(tokenizer_dir: Path) -> None:
    with pytest.raises(ValueError, match="teacher server configs"):
        Distilled(TeacherDistillationConfig(tokenizer_name=str(tokenizer_dir), teacher_enabled=True),
                  APIServerConfig(base_url="http://unused/v1"))


def test_teacher_flags_on_the_command_line() -> None:
    settings = resolve_settings(Distilled, ["process", "--teacher.base_url", "http://teacher/v1",
                                            "--teacher.server_type", "vllm", "--env.teacher_enabled"])
    assert settings.teacher_configs.base_url == "http://teacher/v1" and settings.env_config.teacher_enabled
