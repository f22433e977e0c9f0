"""Editing reasoning blocks (``<think>...</think>``) in replayed messages."""

from __future__ import annotations

import logging
from typing import Any

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
