"""Reward functions: `RewardFunction`, the name `registry` and `CombinedReward`."""

from atroposlib.envs.reward_fns.registry import LegacyFunctionWrapper, RewardRegistry, registry
from atroposlib.envs.reward_fns.reward_function import RewardFunction

__all__ = ["CombinedReward", "LegacyFunctionWrapper", "RewardFunction", "RewardRegistry", "registry"]


def __getattr__(name: str):  # CombinedReward imports the registry: load it on first use
    if name == "CombinedReward":
        from atroposlib.envs.reward_fns.combined_reward import CombinedReward

        return CombinedReward
    raise AttributeError(name)
