"""Checking a submitted group, as a pure function of its bytes.

`inspect_group_body` turns a request body (possibly gzip-compressed) into a
`Submission` summary or raises a client error. It touches no server state, so the
server can run it in worker processes (`atroposlib.api.validator_pool`) and keep its
event loop free: parsing a 1,024-token group costs about as much as everything else a
submission does together.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass, field
from typing import Any, Optional

from pydantic import ValidationError

from atroposlib.wire import PER_SEQUENCE_AUX_KEYS, ScoredData


class PayloadTooLarge(Exception):
    """A decompressed body would exceed the configured cap."""


class InvalidGzip(Exception):
    """A body declared as gzip is not valid gzip."""


class BodyInvalid(Exception):
    """A request body failed validation; `detail` is in FastAPI's 422 ``detail`` format."""

    def __init__(self, detail: list[dict[str, Any]]) -> None:
        super().__init__(describe_validation_problems(detail))
        self.detail = detail


def describe_validation_problems(detail: list[dict[str, Any]]) -> str:
    """One line naming every offending field, e.g. ``body.scores.0: not a finite number``."""
    parts = []
    for problem in detail[:5]:
        location = ".".join(str(part) for part in problem.get("loc", ()))
        parts.append(f"{location}: {problem.get('msg', 'invalid')}")
    more = f" (+{len(detail) - 5} more)" if len(detail) > 5 else ""
    return "; ".join(parts) + more


@dataclass
class Submission:
    """What the server needs to know about a valid group to store it."""

    size: int
    env_id: Optional[int]
    submission_id: Optional[str]
    warnings: list[str] = field(default_factory=list)


def gunzip_capped(data: bytes, limit: int) -> bytes:
    """Decompress (possibly multi-member) gzip without ever producing more than `limit` bytes."""
    out = bytearray()
    while data:
        decompressor = zlib.decompressobj(zlib.MAX_WBITS | 16)
        pending = data
        try:
            while pending:
                out += decompressor.decompress(pending, limit - len(out) + 1)
                if len(out) > limit:
                    raise PayloadTooLarge
                pending = decompressor.unconsumed_tail
            out += decompressor.flush()
        except zlib.error as exc:
            raise InvalidGzip from exc
        if not decompressor.eof:
            raise InvalidGzip
        if len(out) > limit:
            raise PayloadTooLarge
        data = decompressor.unused_data
    return bytes(out)


def schema_problems(exc: ValidationError, prefix: tuple[Any, ...] = ("body",)) -> list[dict[str, Any]]:
    """A pydantic error as FastAPI-style ``detail`` entries (long inputs shortened)."""
    return [
        {"type": e["type"], "loc": [*prefix, *e["loc"]], "msg": e["msg"], "input": _short(e.get("input"))}
        for e in exc.errors(include_url=False, include_context=False)
    ]


def _short(value: Any) -> Any:
    text = repr(value)
    return value if len(text) <= 200 else text[:200] + "..."


def check_group(group: ScoredData, level: str, where: str = "body") -> list[str]:
    """Cross-field checks of one group (see ``--validation``).

    Inconsistent token/mask/score lengths and negative env ids raise `BodyInvalid` in
    every level but ``off``; auxiliary arrays whose length differs from the number of
    sequences are returned as warnings, or raise in ``strict``.
    """
    if level == "off":
        return []
    hard: list[tuple[str, str]] = []
    count = len(group.tokens)
    if count == 0:
        hard.append(("tokens", "a group needs at least one sequence"))
    if len(group.masks) != count:
        hard.append(("masks", f"{len(group.masks)} mask lists for {count} token lists"))
    if len(group.scores) != count:
        hard.append(("scores", f"{len(group.scores)} scores for {count} sequences"))
    for i, (tokens, mask) in enumerate(zip(group.tokens, group.masks)):
        if len(tokens) != len(mask):
            hard.append((f"masks.{i}", f"{len(mask)} labels for {len(tokens)} tokens"))
            break
    if group.env_id is not None and group.env_id < 0:
        hard.append(("env_id", "must not be negative"))
    raise_if_any(hard, where)
    soft = [
        (key, f"{len(value)} entries for {count} sequences")
        for key in PER_SEQUENCE_AUX_KEYS
        if (value := getattr(group, key)) is not None and len(value) != count
    ]
    if level == "strict":
        raise_if_any(soft, where)
    return [f"{where}.{name}: {message}" for name, message in soft]


def raise_if_any(problems: list[tuple[str, str]], where: str) -> None:
    if problems:
        raise BodyInvalid([
            {"type": "value_error", "loc": [*where.split("."), *name.split(".")], "msg": message}
            for name, message in problems
        ])


def summarize(group: ScoredData, level: str, where: str = "body") -> Submission:
    """Check a parsed group and summarise it for storage (raises `BodyInvalid`)."""
    warnings = check_group(group, level, where)
    return Submission(len(group.tokens), group.env_id, group.submission_id, warnings)


def inspect_group_body(body: bytes, gzipped: bool, level: str, max_decompressed: int) -> Submission:
    """Decompress (when `gzipped`), parse and check one submitted group."""
    if gzipped:
        body = gunzip_capped(body, max_decompressed)
    try:
        group = ScoredData.model_validate_json(body)
    except ValidationError as exc:
        raise BodyInvalid(schema_problems(exc)) from None
    return summarize(group, level)
