"""Editing reasoning blocks (``<think>...</think>``) in replayed messages."""

from __future__ import annotations

import logging
from typing import Any, Optional

from atroposlib.utils.tokenize_for_trainer import token_ids

log = logging.getLogger("atroposlib.utils")

OPEN, CLOSE = "<think>", "</think>"


def strip_thinking(text: str) -> str:
    """Remove the first ``<think>...</think>`` block (inclusive), if there is one."""
    start, end = text.find(OPEN), text.find(CLOSE)
    if start == -1 or end == -1:
        return text
    return text[:start] + text[end + len(CLOSE):]


def truncate_thinking(text: str, tokenizer: Any, max_think_tokens: int) -> str:
    """Shorten the reasoning block to at most `max_think_tokens` tokens: keep its last
    paragraph when that fits, else its last tokens (prefixed with ``"... "``)."""
    try:
        start = text.find(OPEN)
        end = text.find(CLOSE, start + len(OPEN)) if start != -1 else -1
        if start == -1 or end == -1:
            return text
        content = text[start + len(OPEN):end].strip()
        before, after = text[:start], text[end + len(CLOSE):]
        if not content:
            return f"{before}{OPEN}{CLOSE}{after}"
        ids = token_ids(tokenizer.encode(content, add_special_tokens=False))
        if len(ids) > max_think_tokens:
            last_paragraph = content.split("\n\n")[-1].strip()
            paragraph_ids = token_ids(tokenizer.encode(last_paragraph, add_special_tokens=False))
            if last_paragraph != content and len(paragraph_ids) <= max_think_tokens:
                content = last_paragraph
            else:
                content = tokenizer.decode(ids[-max_think_tokens:]).strip()
            content = f"... {content}" if content else content
        block = f"{OPEN}\n{content}\n{CLOSE}" if content else f"{OPEN}{CLOSE}"
        return before + block + after
    except Exception as exc:  # a malformed message must never break a rollout
        log.debug("could not truncate thinking: %s", exc)
        return text


AGENT_ROLES = ("agent", "assistant")
REQUIRED_STEP_KEYS = ("messages", "tokens", "masks", "seed", "parsed_actions")


def _is_complete(step: dict[str, Any]) -> bool:
    """Non-empty messages/tokens/masks, and a seed and parsed actions (which may be 0 / empty)."""
    return all(step.get(key) for key in ("messages", "tokens", "masks")) and all(
        step.get(key) is not None for key in ("seed", "parsed_actions"))


def _protected_tail(messages: list[dict[str, Any]]) -> int:
    """How many trailing messages must survive: the final answer and the observation it answers."""
    if len(messages) > 1 and messages[-1].get("role") in AGENT_ROLES:
        return 2 if len(messages) > 2 and messages[-2].get("role") == "environment" else 1
    return 0


def _removable_at_front(messages: list[dict[str, Any]]) -> int:
    """Messages one truncation round removes at index 1: an observation+answer pair when possible."""
    available = len(messages) - 1 - _protected_tail(messages)
    if available <= 0:
        return 0
    pair = available >= 2 and messages[1].get("role") == "environment" and messages[2].get("role") in AGENT_ROLES
    return 2 if pair else 1


def _longest(token_lists: list[Any]) -> int:
    return max((len(t) for t in token_lists if isinstance(t, list)), default=0)


def _truncate_step(step: dict[str, Any], tokenizer: Any, limit: int) -> Optional[dict[str, Any]]:
    """The step with its oldest turns removed uniformly from every alternative until each
    fits in `limit` tokens, or None when that is impossible."""
    from atroposlib.utils.tokenize_for_trainer import tokenize_for_trainer

    messages = [list(alternative) for alternative in step["messages"]]
    tokens, masks = step["tokens"], step["masks"]
    while _longest(tokens) > limit:
        removable = [_removable_at_front(alternative) for alternative in messages]
        if not messages or min(removable) == 0:
            return None
        for alternative in messages:
            del alternative[1:1 + min(removable)]
        try:
            tokenized = [tokenize_for_trainer(tokenizer, alternative) for alternative in messages]
        except Exception as exc:  # a step that cannot be re-tokenised is dropped, not the episode
            log.warning("dropping a step that failed to re-tokenise after truncation: %s", exc)
            return None
        tokens, masks = [t["tokens"] for t in tokenized], [t["masks"] for t in tokenized]
    return {"seed": step["seed"], "messages": messages, "tokens": tokens, "masks": masks,
            "scores": step.get("scores"), "parsed_actions": step["parsed_actions"]}


def ensure_trajectory_token_limit(trajectory: list[Any], tokenizer: Any, max_trajectory_tokens: int) -> list[Any]:
    """Fit every step of a multi-step episode into `max_trajectory_tokens`.

    A step is a scored group whose alternatives are conversations with roles ``system``,
    ``environment`` and ``agent``/``assistant``. Steps lacking messages, tokens, masks,
    seed or parsed_actions are dropped; steps within the limit pass unchanged; longer ones
    lose their oldest turns (the same number in every alternative, keeping the system
    message and the final observation and answer) and are re-tokenised; steps that still
    do not fit are dropped.
    """
    kept: list[Any] = []
    for index, step in enumerate(trajectory or []):
        if not _is_complete(step):
            log.warning("trajectory step %d lacks one of %s; dropped", index, ", ".join(REQUIRED_STEP_KEYS))
            continue
        if _longest(step["tokens"]) <= max_trajectory_tokens:
            kept.append(step)
            continue
        truncated = _truncate_step(step, tokenizer, max_trajectory_tokens)
        if truncated is None:
            log.warning("trajectory step %d cannot fit in %d tokens; dropped", index, max_trajectory_tokens)
        else:
            kept.append(truncated)
    return kept
