"""Reasoning blocks in model replies: ``<think> ... </think>`` and the answer after them.

A *reasoning block* is an opening ``<think>`` tag, the reasoning, and a closing ``</think>``
tag. Tags are matched case-insensitively everywhere in this module: a strict check that
ignored ``<THINK>`` would accept a reply with two blocks. Nothing is stripped: callers that
compare or display the text strip it themselves, so a helper never hides whitespace a
format rule may care about.

There are two readings of "the answer after the thinking", for two kinds of scorer:

* `text_after_thinking` is *lenient*: whatever follows the last ``</think>``, or the whole
  reply when there is none. Scorers that grade only the answer (math, GSM8K) use it; a
  chat template may pre-fill ``<think>`` so the reply holds only the closing tag, and a
  reply that never closes its reasoning is simply graded as a whole.
* `text_after_single_think_block` is *strict*: the text after the reasoning block only
  when the reply has exactly one ``<think>`` and exactly one ``</think>``, in that order;
  None otherwise. Environments that reward the format itself use it.

`thinking_content` reads the reasoning instead of the answer.
"""

from __future__ import annotations

import re
from typing import Optional

# The tag patterns, for callers that count or locate tags themselves.
THINK_OPEN = re.compile(r"<think>", re.IGNORECASE)
THINK_CLOSE = re.compile(r"</think>", re.IGNORECASE)
_THINK_BLOCK = re.compile(r"<think>(.*?)</think>", re.DOTALL | re.IGNORECASE)


def text_after_thinking(text: Optional[str]) -> str:
    """The text after the last ``</think>`` (unstripped).

    Edge cases: no ``</think>`` (including an unclosed ``<think>``) gives the whole text;
    several give the text after the last one, since everything before it was reasoning;
    None gives ``""``.
    """
    text = text or ""
    closes = list(THINK_CLOSE.finditer(text))
    return text[closes[-1].end():] if closes else text


def text_after_single_think_block(text: Optional[str]) -> Optional[str]:
    """The text after a well-formed reasoning block (unstripped), or None.

    Well formed means exactly one ``<think>`` and exactly one ``</think>``, the opening tag
    first. A missing, repeated, unclosed or reversed tag gives None; so does None.
    """
    text = text or ""
    opens = THINK_OPEN.findall(text)
    closes = list(THINK_CLOSE.finditer(text))
    if len(opens) != 1 or len(closes) != 1:
        return None
    if THINK_OPEN.search(text).start() > closes[0].start():
        return None
    return text[closes[0].end():]


def thinking_content(text: Optional[str]) -> Optional[str]:
    """The reasoning inside the first complete ``<think> ... </think>`` block (unstripped).

    None when there is no complete block (no tags, or an unclosed ``<think>``); ``""`` for
    an empty block, so callers can tell a missing block from an empty one.
    """
    found = _THINK_BLOCK.search(text or "")
    return found.group(1) if found else None
