"""`CombinedReward` (``combined``): several rewards added up, each with its own weight."""

from __future__ import annotations

import logging
from typing import Any, Union

from atroposlib.envs.reward_fns.registry import registry
from atroposlib.envs.reward_fns.reward_function import RewardFunction

log = logging.getLogger("atroposlib.rewards")


@registry.register
class CombinedReward(RewardFunction):
    """Sum of sub-rewards (weighted; `legacy_unweighted` sums raw values as Atropos did),
    optionally normalised by the weights' sum (``sum``) or to [0, 1] (``minmax``)."""

    def __init__(self, rewards: list[Union[str, dict[str, Any]]], normalization: str = "none",
                 weight: float = 1.0, legacy_unweighted: bool = False, **kwargs: Any) -> None:
        self.rewards = [registry.create(r) for r in rewards]
        super().__init__(weight=weight, name=f"combined({','.join(r.name for r in self.rewards)})", **kwargs)
        if normalization not in ("none", "sum", "minmax"):
            raise ValueError("normalization must be none, sum or minmax")
        self.normalization = normalization
        self.legacy_unweighted = legacy_unweighted

    def set_wandb_logger(self, logger: Any) -> None:
        super().set_wandb_logger(logger)
        for reward in self.rewards:
            reward.set_wandb_logger(logger)

    def compute(self, completions: list[Any], **kwargs: Any) -> list[float]:
        total = [0.0] * len(completions)
        for reward in self.rewards:
            try:
                values = reward.compute(completions, **kwargs) if self.legacy_unweighted else reward(completions, **kwargs)
            except Exception as exc:
                log.warning("sub-reward %s failed and is skipped: %s", reward.name, exc)
                continue
            total = [t + v for t, v in zip(total, values)]
        if self.normalization == "sum":
            weights = sum(r.weight for r in self.rewards)
            if weights > 0:
                total = [t / weights for t in total]
        elif self.normalization == "minmax" and total and max(total) > min(total):
            low, high = min(total), max(total)
            total = [(t - low) / (high - low) for t in total]
        return total
