"""`ReasoningConfig`: how an environment asks models to think before answering."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

EFFORT_TO_MAX_TOKENS = {"none": 1024, "minimal": 3200, "low": 6400, "medium": 16000, "high": 25600, "xhigh": 30400}
DEFAULT_REASONING_MAX_TOKENS = 8192


@dataclass
class ReasoningConfig:
    """Reasoning request settings; setting `effort` or `max_tokens` enables reasoning."""

    enabled: bool = False
    effort: Optional[str] = None
    max_tokens: Optional[int] = None

    def __post_init__(self) -> None:
        if self.effort is not None and self.effort not in EFFORT_TO_MAX_TOKENS:
            raise ValueError(f"Invalid reasoning_effort {self.effort!r}: use one of {', '.join(EFFORT_TO_MAX_TOKENS)}")
        if self.effort is not None or self.max_tokens is not None:
            self.enabled = True

    @classmethod
    def from_env_config(cls, config: Any) -> "ReasoningConfig":
        return cls(
            enabled=bool(getattr(config, "thinking_mode", False)),
            effort=getattr(config, "reasoning_effort", None),
            max_tokens=getattr(config, "max_reasoning_tokens", None),
        )

    def is_reasoning_kwargs_active(self) -> bool:
        return self.enabled

    def build_extra_body(self, base_url: Optional[str] = None, use_max_tokens: bool = False) -> Optional[dict[str, Any]]:
        """The request's ``extra_body`` for this reasoning setting (None when off)."""
        if not self.enabled:
            return None
        if base_url and "api.openai.com" in base_url:
            return {"reasoning_effort": self.effort or "medium"}
        reasoning: dict[str, Any] = {"enabled": True}
        if use_max_tokens and self.effort is not None:
            reasoning["max_tokens"] = EFFORT_TO_MAX_TOKENS.get(self.effort, DEFAULT_REASONING_MAX_TOKENS)
        elif self.effort is not None:
            reasoning["effort"] = self.effort
        elif self.max_tokens is not None:
            reasoning["max_tokens"] = self.max_tokens
        return {"reasoning": reasoning}

    def inject(self, kwargs: dict[str, Any], base_url: Optional[str]) -> None:
        """Merge reasoning settings into chat-completion `kwargs` (in place)."""
        extra = self.build_extra_body(base_url)
        if extra is None:
            return
        kwargs["extra_body"] = {**(kwargs.get("extra_body") or {}), **extra}
        if base_url and "api.openai.com" in base_url:
            kwargs["temperature"] = 1.0
            if kwargs.get("max_tokens"):
                kwargs["max_completion_tokens"] = kwargs.pop("max_tokens")
