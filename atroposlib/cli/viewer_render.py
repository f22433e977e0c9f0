"""A scored group as the viewers show it: the shared prompt, each completion with its score,
and the trained span of each completion, turned into HTML that is safe to put in a page.

The prompt is the longest common prefix of the decoded rollouts, cut where the first trained
token starts (rollouts whose completions begin alike would otherwise lose that beginning).

The trained span is where a sequence's mask is not -100 (the tokens the trainer learns
from). Token runs are located in the decoded text by decoding growing token prefixes, so the
highlighted pieces always join up to exactly the decoded sequence (decoding each run on its
own can differ, e.g. a multi-byte character split across runs). Everything that came from a
model is HTML-escaped: a completion holding ``<script>`` is shown as text, never run.
"""

from __future__ import annotations

import html
import math
from dataclasses import dataclass
from statistics import fmean
from typing import Any, NamedTuple, Optional, Sequence

from atroposlib.cli.group_text import split_common_prefix

IGNORED = -100  # mask value of a token the trainer does not learn from
TRAINED_LEGEND = "highlighted text = trained tokens (mask ≠ -100)"


class Segment(NamedTuple):
    """A piece of decoded text and whether its tokens are trained."""

    text: str
    trained: bool


@dataclass(frozen=True)
class Completion:
    segments: tuple[Segment, ...]
    score: Optional[float]

    @property
    def text(self) -> str:
        return "".join(segment.text for segment in self.segments)


@dataclass(frozen=True)
class GroupView:
    """What a viewer shows of one group; `note` says why something usual is missing."""

    prompt: str
    completions: tuple[Completion, ...]
    env_id: Any = None
    note: str = ""

    def best(self) -> frozenset[int]:
        """Indices of the highest score; empty when the scores do not tell rollouts apart."""
        scores = {i: c.score for i, c in enumerate(self.completions) if _finite(c.score)}
        if len(set(scores.values())) < 2:
            return frozenset()
        top = max(scores.values())
        return frozenset(i for i, score in scores.items() if score == top)


def _finite(score: Any) -> bool:
    return isinstance(score, (int, float)) and not isinstance(score, bool) and math.isfinite(score)


def token_runs(mask: Sequence[int]) -> list[tuple[int, int, bool]]:
    """``(start, end, trained)`` for each maximal run of tokens that are all trained or all not."""
    runs: list[tuple[int, int, bool]] = []
    start = 0
    for i in range(1, len(mask) + 1):
        if i == len(mask) or (mask[i] != IGNORED) != (mask[start] != IGNORED):
            runs.append((start, i, mask[start] != IGNORED))
            start = i
    return runs


def decode_segments(tokenizer: Any, tokens: Sequence[int], mask: Optional[Sequence[int]]) -> list[Segment]:
    """The decoded sequence cut into trained and untrained pieces (one piece without a usable mask)."""
    text = tokenizer.decode(list(tokens))
    if mask is None or len(mask) != len(tokens):
        return [Segment(text, False)] if text else []
    segments: list[Segment] = []
    done = 0
    for _, end, trained in token_runs(mask):
        offset = _text_offset(tokenizer, tokens, end, text)
        if offset > done:
            segments.append(Segment(text[done:offset], trained))
            done = offset
    return segments


def _text_offset(tokenizer: Any, tokens: Sequence[int], end: int, text: str) -> int:
    """Where the text of ``tokens[:end]`` ends in `text`; moves past tokens that only decode
    together with the next ones (a partial UTF-8 character decodes as U+FFFD on its own)."""
    for stop in range(end, len(tokens)):
        head = tokenizer.decode(list(tokens[:stop]))
        if text.startswith(head):
            return len(head)
    return len(text)


def clip_segments(segments: Sequence[Segment], start: int) -> tuple[Segment, ...]:
    """The segments of the text from character `start` on."""
    kept: list[Segment] = []
    position = 0
    for segment in segments:
        end = position + len(segment.text)
        if end > start:
            kept.append(Segment(segment.text[max(0, start - position):], segment.trained))
        position = end
    return tuple(kept)


def format_messages(messages: Sequence[Any]) -> str:
    """A conversation as plain text, one ``role: content`` block per message."""
    blocks = []
    for message in messages:
        if not isinstance(message, dict):
            blocks.append(str(message))
            continue
        blocks.append(f"{message.get('role', '?')}: {_content_text(message.get('content', ''))}")
    return "\n\n".join(blocks) + "\n\n" if blocks else ""


def _content_text(content: Any) -> str:
    if not isinstance(content, list):
        return "" if content is None else str(content)
    parts = []
    for part in content:
        if isinstance(part, dict) and part.get("type") == "text":
            parts.append(str(part.get("text", "")))
        elif isinstance(part, dict):
            parts.append(f"[{part.get('type', 'part')}]")
        else:
            parts.append(str(part))
    return " ".join(parts)


def view_group(group: dict[str, Any], tokenizer: Any = None) -> GroupView:
    """The group decoded with `tokenizer`, or from its ``messages`` when there is no tokenizer;
    `ValueError` when it has neither."""
    note = ""
    if tokenizer is not None and group.get("tokens"):
        masks = group.get("masks") or []
        sequences = [decode_segments(tokenizer, tokens, masks[i] if i < len(masks) else None)
                     for i, tokens in enumerate(group["tokens"])]
    elif group.get("messages"):
        sequences = [[Segment(format_messages(messages), False)] for messages in group["messages"]]
        note = "shown from the group's messages (no tokenizer): trained spans are not marked"
    else:
        raise ValueError("the group has no messages, and no tokenizer was loaded to decode its tokens")
    prompt, _ = split_common_prefix(["".join(s.text for s in segments) for segments in sequences])
    # The prompt stops where training starts: completions that begin alike keep their shared start.
    starts = [start for start in map(_trained_start, sequences) if start is not None]
    prompt = prompt[:min(starts)] if starts else prompt
    scores = list(group.get("scores") or [])
    completions = tuple(
        Completion(clip_segments(segments, len(prompt)), scores[i] if i < len(scores) else None)
        for i, segments in enumerate(sequences))
    return GroupView(prompt=prompt, completions=completions, env_id=group.get("env_id"), note=note)


def _trained_start(segments: Sequence[Segment]) -> Optional[int]:
    """Where the first trained piece starts in the text, or None when nothing is trained."""
    position = 0
    for segment in segments:
        if segment.trained:
            return position
        position += len(segment.text)
    return None


def format_score(score: Optional[float]) -> str:
    return "–" if score is None else f"{score:.4g}" if _finite(score) else str(score)


def completion_html(completion: Completion) -> str:
    """The completion, escaped, with its trained pieces in ``<mark>``."""
    if not completion.text:
        return '<div class="vr-completion"><em>(empty completion)</em></div>'
    pieces = [f'<mark class="vr-trained">{html.escape(s.text)}</mark>' if s.trained else html.escape(s.text)
              for s in completion.segments]
    return f'<div class="vr-completion">{"".join(pieces)}</div>'


def status_html(view: Optional[GroupView], position: int, total: int, origin: str, message: str = "") -> str:
    """The line above a group: which group of how many, its env and where it came from, its scores."""
    parts = []
    if view is not None:
        parts.append(f"<b>Group {position + 1} of {total}</b>")
        parts.append(f"env {html.escape(str(view.env_id))}" if view.env_id is not None else "env –")
        if origin:
            parts.append(html.escape(origin))
        scores = [c.score for c in view.completions if _finite(c.score)]
        if scores:
            parts.append(f"scores min {format_score(min(scores))} / mean {format_score(fmean(scores))} "
                         f"/ max {format_score(max(scores))}")
        parts.append(f'<mark class="vr-trained">{html.escape(TRAINED_LEGEND)}</mark>')
    lines = [" · ".join(parts)] if parts else []
    for extra in (view.note if view else "", message):
        if extra:
            lines.append(f'<span class="vr-note">{html.escape(extra)}</span>')
    return f'<div class="vr-status">{"<br>".join(lines)}</div>'
