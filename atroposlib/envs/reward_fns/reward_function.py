"""`RewardFunction`: a named, weighted scorer of completions."""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from typing import Any, Optional

log = logging.getLogger("atroposlib.rewards")


class RewardFunction(ABC):
    """Scores a list of completions; calling it applies `weight` and never raises."""

    def __init__(self, weight: float = 1.0, name: Optional[str] = None, **kwargs: Any) -> None:
        self.weight = weight
        self._name = name
        self.config = kwargs
        self.wandb_logger: Any = None

    @property
    def name(self) -> str:
        return self._name or type(self).__name__.lower()

    @abstractmethod
    def compute(self, completions: list[Any], **kwargs: Any) -> list[float]:
        """Raw (unweighted) reward per completion."""

    def __call__(self, completions: list[Any], **kwargs: Any) -> list[float]:
        try:
            raw = self.compute(completions, **kwargs)
        except Exception:
            log.exception("reward %s failed; scoring 0", self.name)
            return [0.0] * len(completions)
        weighted = [value * self.weight for value in raw]
        if self.wandb_logger is not None:
            self.log_metrics(raw, weighted)
        return weighted

    def set_wandb_logger(self, logger: Any) -> None:
        self.wandb_logger = logger

    def log_metrics(self, raw: list[float], weighted: list[float]) -> None:
        if not raw:
            return
        self.wandb_logger.log({
            f"reward/{self.name}/mean_raw": sum(raw) / len(raw),
            f"reward/{self.name}/mean_weighted": sum(weighted) / len(weighted),
            f"reward/{self.name}/min": min(raw),
            f"reward/{self.name}/max": max(raw),
        })

    @staticmethod
    def get_content(completion: Any) -> str:
        """The assistant text of a completion given as text, a message or a message list."""
        if isinstance(completion, str):
            return completion
        if isinstance(completion, dict):
            if completion.get("role") == "assistant":
                return str(completion.get("content") or "")
            message = completion.get("message")
            if isinstance(message, dict) and message.get("role") == "assistant":
                return str(message.get("content") or "")
            return ""
        if isinstance(completion, list):
            for message in completion:
                if isinstance(message, dict) and message.get("role") == "assistant":
                    return str(message.get("content") or "")
        return ""
