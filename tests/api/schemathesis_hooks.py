"""Schemathesis hooks (loaded through ``SCHEMATHESIS_HOOKS``) for the contract test.

JSON Schema cannot say that a group's masks, scores and per-token arrays line up with
its tokens, so a group generated from the schema alone is almost never one the server
may accept. For cases whose body is meant to be valid, these hooks line the generated
arrays up with the generated tokens; the body then is a group every level accepts.
Bodies meant to be invalid are left as generated.
"""

from __future__ import annotations

from typing import Any

import schemathesis
from schemathesis.core.parameters import ParameterLocation

MASKED = -100
SUBMISSION_PATHS = {"/scored_data", "/scored_data_list"}
PER_TOKEN_FLOATS = ("advantages", "ref_logprobs", "inference_logprobs")


def consistent_group(group: Any) -> Any:
    """`group` with every array sized by its tokens (values kept where they fit)."""
    if not isinstance(group, dict) or not isinstance(group.get("tokens"), list):
        return group
    tokens = group["tokens"]
    group["masks"] = [[MASKED if j == 0 else token for j, token in enumerate(seq)] for seq in tokens]
    group["scores"] = _cycled(group.get("scores") or [0.0], len(tokens))
    for key in PER_TOKEN_FLOATS:
        if group.get(key) is not None:
            group[key] = [[0.0] * len(seq) for seq in tokens]
    for key in ("distill_token_ids", "distill_logprobs"):
        if group.get(key) is not None:
            group[key] = [[[] for _ in seq] for seq in tokens]
    if group.get("overrides") is not None:
        group["overrides"] = _cycled(group["overrides"] or [{}], len(tokens))
    return group


def _cycled(values: list[Any], count: int) -> list[Any]:
    return [values[i % len(values)] for i in range(count)]


@schemathesis.hook
def map_case(context: Any, case: Any) -> Any:
    if case.operation.path not in SUBMISSION_PATHS or case.meta is None:
        return case
    if case.meta.is_negative_at(ParameterLocation.BODY):
        return case
    if isinstance(case.body, list):
        case.body = [consistent_group(group) for group in case.body]
    else:
        case.body = consistent_group(case.body)
    return case
