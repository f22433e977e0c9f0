"""`ReasoningStepsReward` (``reasoningsteps``): does the text show its steps?"""

from __future__ import annotations

import re
from typing import Any, Optional

from atroposlib.envs.reward_fns.registry import registry
from atroposlib.envs.reward_fns.reward_function import RewardFunction

PATTERNS = {
    "numbered_steps": re.compile(r"\bstep\s*\d+\s*[:.)]", re.IGNORECASE),
    "list_numbers": re.compile(r"^\s*\d+[.)]\s", re.MULTILINE),
    "bullet_points": re.compile(r"^\s*[-*\u2022]\s", re.MULTILINE),
    "transition_words": re.compile(r"\b(first|second|third|next|then|finally|therefore|thus|hence)\b", re.IGNORECASE),
}
DEFAULT_WEIGHTS = {"numbered_steps": 0.5, "list_numbers": 0.5, "bullet_points": 0.4, "transition_words": 0.3}


@registry.register
class ReasoningStepsReward(RewardFunction):
    """Σ over step patterns of min(1, matches / min_steps) x weight, plus `base_score` for
    texts longer than `min_words`; at most 1.0."""

    def __init__(self, min_words: int = 10, min_steps: int = 3, base_score: float = 0.1,
                 pattern_weights: Optional[dict[str, float]] = None, weight: float = 1.0, **kwargs: Any) -> None:
        super().__init__(weight=weight, **kwargs)
        self.min_words, self.min_steps, self.base_score = min_words, min_steps, base_score
        self.pattern_weights = pattern_weights or DEFAULT_WEIGHTS

    def compute(self, completions: list[Any], **kwargs: Any) -> list[float]:
        scores = []
        for completion in completions:
            text = self.get_content(completion)
            score = sum(
                min(1.0, len(PATTERNS[name].findall(text)) / self.min_steps) * w
                for name, w in self.pattern_weights.items() if name in PATTERNS
            )
            if len(text.split()) > self.min_words:
                score += self.base_score
            scores.append(min(1.0, score))
        return scores


def reasoning_steps_reward(completions: list[Any], **kwargs: Any) -> list[float]:
    return ReasoningStepsReward().compute(completions, **kwargs)
