"""Which scored groups an environment keeps, before sending or writing them.

A group is dropped (and counted by reason) when it has the wrong number of rollouts,
when all its scores are equal and the config asks for differing ones, or when a
sequence reaches the trainer's maximum length. Kept groups get the optional keys the
API expects and, when asked, messages decoded from their tokens.
"""

from __future__ import annotations

import logging
from collections import Counter
from typing import Any, Optional

log = logging.getLogger("atroposlib.envs")

DEFAULTED_KEYS = ("ref_logprobs", "overrides", "group_overrides", "distill_token_ids", "distill_logprobs")


def drop_reason(group: dict[str, Any], group_size: int, ensure_scores_differ: bool,
                max_token_len: int, abort_on_too_long: bool) -> Optional[str]:
    """Why `group` must not be kept, or None."""
    overrides = group.get("group_overrides") or {}
    expected = overrides.get("group_size", group_size)
    tokens = group.get("tokens")
    if not tokens or len(tokens) != expected:
        return "wrong_group_size"
    scores = group.get("scores") or []
    if ensure_scores_differ and len(set(scores)) <= 1:
        return "same_scores"
    if max_token_len > 0 and abort_on_too_long and any(len(seq) >= max_token_len for seq in tokens):
        return "too_long"
    return None


def complete_group(group: dict[str, Any], tokenizer: Any, include_messages: bool) -> dict[str, Any]:
    """Fill the keys a kept group must carry (in place) and return it."""
    for key in DEFAULTED_KEYS:
        group.setdefault(key, None)
    if include_messages and not group.get("messages"):
        group["messages"] = [[{"role": "user", "content": tokenizer.decode(seq)}] for seq in group["tokens"]]
    return group


def trainable_lengths(group: dict[str, Any]) -> list[int]:
    return [sum(1 for label in mask if label != -100) for mask in group.get("masks") or []]


SAME_SCORES_REMEDY = "--env.ensure_scores_are_not_same false keeps groups whose scores are all equal"
# What each drop reason means for the person running the env, and how to change it.
DROP_EXPLANATIONS = {
    "same_scores": f"all scores in the group were equal; {SAME_SCORES_REMEDY}",
    "too_long": "a sequence reached the trainer's max_token_len; shorten generations (--env.max_token_length)",
    "wrong_group_size": "the group did not hold group_size rollouts",
    "timed_out": "its rollouts exceeded --env.worker_timeout on every attempt",
    "no_group": "the environment returned no group (its own filter, e.g. all scores equal or all rollouts unusable)",
    "error": "generating or scoring raised an error (logged above)",
}


class SkipCounter(Counter):
    """Dropped groups by reason, logged as ``train/groups_skipped/<reason>``."""

    def metrics(self) -> dict[str, float]:
        return {f"train/groups_skipped/{reason}": float(count) for reason, count in self.items()}

    def summary(self) -> str:
        """``0 dropped`` or ``5 dropped (same_scores 4, too_long 1)``."""
        total = sum(self.values())
        if not total:
            return "0 dropped"
        return f"{total} dropped (" + ", ".join(f"{reason} {count}" for reason, count in self.most_common()) + ")"


def explain_drop(reason: str) -> str:
    """One line telling why groups with `reason` are dropped and what changes it."""
    return f"dropping groups: {reason} ({DROP_EXPLANATIONS.get(reason, 'see the environment')})"
