"""`FormatReward` (``format``): are the expected ``<tag>...</tag>`` blocks present?"""

from __future__ import annotations

import re
from typing import Any, Optional

from atroposlib.envs.reward_fns.registry import registry
from atroposlib.envs.reward_fns.reward_function import RewardFunction


@registry.register
class FormatReward(RewardFunction):
    """1.0 when any (or, with `require_all_tags`, every) preferred tag pair occurs."""

    def __init__(self, preferred_tags: Optional[list[str]] = None, require_all_tags: bool = False,
                 case_sensitive: bool = False, weight: float = 1.0, **kwargs: Any) -> None:
        super().__init__(weight=weight, **kwargs)
        self.preferred_tags = preferred_tags or ["think", "answer"]
        self.require_all_tags = require_all_tags
        self.flags = re.DOTALL | (0 if case_sensitive else re.IGNORECASE)

    def compute(self, completions: list[Any], **kwargs: Any) -> list[float]:
        scores = []
        for completion in completions:
            text = self.get_content(completion)
            found = [bool(re.search(f"<{re.escape(t)}>.*?</{re.escape(t)}>", text, self.flags)) for t in self.preferred_tags]
            scores.append(1.0 if (all(found) if self.require_all_tags else any(found)) else 0.0)
        return scores


def format_reward(completions: list[Any], **kwargs: Any) -> list[float]:
    return FormatReward().compute(completions, **kwargs)
