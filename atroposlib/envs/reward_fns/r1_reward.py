"""DeepSeek-R1 style rewards: a thinking block then a response, and the response's answer."""

from __future__ import annotations

import re
from typing import Any

from atroposlib.envs.reward_fns.registry import registry
from atroposlib.envs.reward_fns.reward_function import RewardFunction

THINK = re.compile(r"<think>(.*?)</think>", re.DOTALL)


def split_thinking(text: str) -> tuple[list[str], str]:
    """(thinking blocks, response after the last block or the whole text)."""
    blocks = THINK.findall(text)
    response = text.rsplit("</think>", 1)[-1] if blocks else text
    return blocks, response


@registry.register
class FormatReasoningReward(RewardFunction):
    """`reward_value` when the thinking and response parts are there as required."""

    def __init__(self, reward_value: float = 0.5, require_thinking: bool = True, require_response: bool = True,
                 allow_multiple_thinking: bool = False, weight: float = 1.0, **kwargs: Any) -> None:
        super().__init__(weight=weight, **kwargs)
        self.reward_value = reward_value
        self.require_thinking, self.require_response = require_thinking, require_response
        self.allow_multiple_thinking = allow_multiple_thinking

    def compute(self, completions: list[Any], **kwargs: Any) -> list[float]:
        scores = []
        for completion in completions:
            blocks, response = split_thinking(self.get_content(completion))
            ok = (not self.require_thinking or (blocks and blocks[0].strip())) and (
                not self.require_response or response.strip()) and (self.allow_multiple_thinking or len(blocks) <= 1)
            scores.append(self.reward_value if ok else 0.0)
        return scores


@registry.register
class AccuracyXReward(RewardFunction):
    """`reward_value` when the response equals (or contains) the solution text."""

    def __init__(self, exact_match: bool = False, case_sensitive: bool = False, reward_value: float = 1.0,
                 weight: float = 1.0, **kwargs: Any) -> None:
        super().__init__(weight=weight, **kwargs)
        self.exact_match, self.case_sensitive, self.reward_value = exact_match, case_sensitive, reward_value

    def compute(self, completions: list[Any], solution: Any = None, **kwargs: Any) -> list[float]:
        if solution is None:
            return [0.0] * len(completions)
        solutions = solution if isinstance(solution, list) else [solution] * len(completions)
        scores = []
        for completion, expected in zip(completions, solutions):
            response = split_thinking(self.get_content(completion))[1].strip()
            expected = str(expected).strip()
            if not self.case_sensitive:
                response, expected = response.casefold(), expected.casefold()
            hit = response == expected if self.exact_match else expected in response
            scores.append(self.reward_value if hit else 0.0)
        return scores


@registry.register
class R1Reward(RewardFunction):
    """`format_weight` x format + `accuracy_weight` x accuracy (each scored 0 or 1)."""

    def __init__(self, format_weight: float = 0.5, accuracy_weight: float = 1.0, weight: float = 1.0, **kwargs: Any) -> None:
        super().__init__(weight=weight, **kwargs)
        self.format_weight, self.accuracy_weight = format_weight, accuracy_weight
        self.format = FormatReasoningReward(reward_value=1.0)
        self.accuracy = AccuracyXReward(reward_value=1.0)

    def compute(self, completions: list[Any], **kwargs: Any) -> list[float]:
        formats = self.format.compute(completions, **kwargs)
        accuracies = self.accuracy.compute(completions, **kwargs)
        return [self.format_weight * f + self.accuracy_weight * a for f, a in zip(formats, accuracies)]


def format_reasoning_reward(completions: list[Any], **kwargs: Any) -> list[float]:
    return FormatReasoningReward().compute(completions, **kwargs)


def r1_reward(completions: list[Any], **kwargs: Any) -> list[float]:
    return R1Reward().compute(completions, **kwargs)
