"""process mode's progress bar: groups written with rate and ETA, rollouts as they finish."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from atroposlib.envs.process_mode import process
from tests.envs.test_base import Scripted, make_env


class WholeGroups(Scripted):
    """An env that builds its groups itself (one request with n=group_size, say)."""

    async def collect_trajectories(self, item: Any) -> tuple[dict[str, Any], list[Any]]:
        await asyncio.sleep(0.01)
        size = self.config.group_size
        return {"tokens": [[1, 2, 3]] * size, "masks": [[-100, 2, 3]] * size,
                "scores": [float(i) for i in range(size)]}, []


@pytest.mark.parametrize("env_class", [Scripted, WholeGroups])
def test_bar_shows_groups_with_rate_and_rollouts(
    env_class: type, tokenizer_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    env = make_env(tokenizer_dir, tmp_path, env_class=env_class, total_steps=3,
                   data_path_to_save_groups=str(tmp_path / "g.jsonl"))
    asyncio.run(process(env))
    assert env.rollouts_finished == 12
    bar = capsys.readouterr().err.replace("\r", "\n").splitlines()
    final = [line for line in bar if line.startswith("scripted: 100%")][-1]
    assert "3/3" in final and ("group/s" in final or "s/group" in final)
    assert "rollouts=12" in final
    assert len((tmp_path / "g.jsonl").read_text().splitlines()) == 3
