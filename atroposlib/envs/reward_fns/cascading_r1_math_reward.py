"""``cascading_r1_math``: accuracy first; a format bonus only for correct answers."""

from __future__ import annotations

import re
from typing import Any

from atroposlib.envs.reward_fns.accuracy_reward import AccuracyReward

WELL_FORMED = re.compile(r"^<think>.*?</think>[^<]*$", re.DOTALL)


def cascading_r1_math_reward(completions: list[Any], solution: Any = None, **kwargs: Any) -> list[float]:
    """1.0 for a correct answer (at most 6 ``\\boxed``), plus 0.5 when it is also a
    single thinking block followed by plain text."""
    accuracy = AccuracyReward(max_boxed_threshold=6).compute(completions, solution=solution, **kwargs)
    return [
        a + (0.5 if a > 0 and WELL_FORMED.match(AccuracyReward.get_content(c).strip()) else 0.0)
        for a, c in zip(accuracy, completions)
    ]
