"""`CrosswordFormatReward` (``crosswordformat``): answers given as ``N-Across: WORD``."""

from __future__ import annotations

import re
import string
from typing import Any, Optional

from atroposlib.envs.reward_fns.registry import registry
from atroposlib.envs.reward_fns.reward_function import RewardFunction

DEFAULT_PATTERNS = [r"\d+-Across:\s*\S+", r"\d+-Down:\s*\S+"]


@registry.register
class CrosswordFormatReward(RewardFunction):
    """`reward_value` when a clue answer is present and (optionally) every answer uses
    only `valid_chars`."""

    def __init__(self, format_patterns: Optional[list[str]] = None, reward_value: float = 1.0,
                 penalize_invalid_chars: bool = True, valid_chars: str = string.ascii_uppercase,
                 weight: float = 1.0, **kwargs: Any) -> None:
        super().__init__(weight=weight, **kwargs)
        self.patterns = [re.compile(p, re.IGNORECASE) for p in (format_patterns or DEFAULT_PATTERNS)]
        self.reward_value = reward_value
        self.penalize_invalid_chars = penalize_invalid_chars
        self.valid_chars = set(valid_chars)

    def compute(self, completions: list[Any], **kwargs: Any) -> list[float]:
        scores = []
        for completion in completions:
            text = self.get_content(completion)
            ok = any(p.search(text) for p in self.patterns)
            if ok and self.penalize_invalid_chars:
                answers = re.findall(r"(?:Across|Down):\s*(\S+)", text)
                ok = all(set(answer) <= self.valid_chars for answer in answers)
            scores.append(self.reward_value if ok else 0.0)
        return scores


def crossword_format_reward(completions: list[Any], **kwargs: Any) -> list[float]:
    return CrosswordFormatReward().compute(completions, **kwargs)
