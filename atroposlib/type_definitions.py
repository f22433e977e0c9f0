"""Type names environment code uses for items, messages, agent and game histories and
evaluation results. All are plain data at runtime (TypedDicts and aliases)."""

from __future__ import annotations

from typing import Any, Literal, Optional, TypedDict, Union

Item = Any
UUID = str
number = Union[int, float]
Content = Union[str, list[dict[str, Any]]]


class Message(TypedDict, total=False):
    """One chat message; ``reward`` optionally scores an assistant turn."""

    role: Literal["system", "user", "assistant", "tool"]
    content: Content
    reward: Optional[float]


class AgentStep(TypedDict, total=False):
    step: int
    messages: list[Message]
    reward: float


AgentHistory = dict[str, list[AgentStep]]


class Observation(TypedDict):
    raw: dict[str, Any]
    rendered: Content


class GameStep(TypedDict):
    step: int
    agent_id: str
    observation: Observation
    action: str
    reward: Union[float, dict[str, float]]
    done: bool
    info: dict[str, Any]


GameHistory = list[GameStep]


class EvaluationConfigGeneral(TypedDict, total=False):
    model_name: str
    total_evaluation_time_seconds: str
    generation_parameters: dict[str, Any]


EvaluationMetrics = dict[str, float]


class EvaluationResults(TypedDict, total=False):
    config_general: EvaluationConfigGeneral
    results: dict[str, EvaluationMetrics]


class EvaluationSample(TypedDict, total=False):
    messages: list[Message]
    question: str
    gold_answer: str
    gold_parsed: str
    model_parsed: str
    score: float
    correct: bool
    finish_reason: str
    response_after_think: str
