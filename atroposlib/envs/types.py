"""What environments produce: scored groups and single scored rollouts (plain dicts)."""

from __future__ import annotations

from enum import Enum
from typing import Any, Optional, TypedDict

from atroposlib.type_definitions import Message


class ScoredDataGroup(TypedDict, total=False):
    """Rollouts of one item scored together (the unit sent to the trajectory API)."""

    tokens: list[list[int]]
    masks: list[list[int]]
    scores: list[float]
    advantages: Optional[list[list[float]]]
    ref_logprobs: Optional[list[list[float]]]
    messages: Optional[list[list[Message]]]
    generation_params: Optional[dict[str, Any]]
    inference_logprobs: Optional[list[list[float]]]
    group_overrides: Optional[dict[str, Any]]
    overrides: Optional[list[dict[str, Any]]]
    images: Optional[Any]
    distill_token_ids: Optional[list[list[list[int]]]]
    distill_logprobs: Optional[list[list[list[float]]]]


class ScoredDataItem(TypedDict, total=False):
    """One scored rollout, as returned by `BaseEnv.collect_trajectory`."""

    tokens: list[int]
    masks: list[int]
    scores: float
    advantages: Optional[list[float]]
    ref_logprobs: Optional[list[float]]
    messages: Optional[list[Message]]
    group_overrides: Optional[dict[str, Any]]
    overrides: Optional[dict[str, Any]]
    images: Optional[Any]
    inference_logprobs: Optional[list[float]]
    generation_params: Optional[dict[str, Any]]
    distill_token_ids: Optional[list[list[int]]]
    distill_logprobs: Optional[list[list[float]]]


class EvalHandlingEnum(str, Enum):
    """What training does while an evaluation runs."""

    STOP_TRAIN = "STOP_TRAIN"
    LIMIT_TRAIN = "LIMIT_TRAIN"
    NONE = "NONE"
