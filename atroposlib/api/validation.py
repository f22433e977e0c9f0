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
from typing import Any, Optional, TypeVar, Union

from pydantic import BaseModel, TypeAdapter, ValidationError

from atroposlib.api.group_checks import Problem, quality_problems, structural_problems
from atroposlib.policy_version import group_policy_version
from atroposlib.wire import ScoredData

Parsed = TypeVar("Parsed")


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
    longest: int = 0
    problems: list[Problem] = field(default_factory=list)
    policy_version: Optional[int] = None

    @property
    def warnings(self) -> list[str]:
        return [problem.text() for problem in self.problems]


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


JSON_WHITESPACE = b" \t\n\r"


def body_is_absent(body: bytes) -> bool:
    """Whether an optional JSON body was left out: empty or only JSON's whitespace (space, tab,
    line feed, carriage return). Other bytes, even ones Python calls whitespace such as 0x0b,
    are a body, and one that does not parse is refused."""
    return not body.strip(JSON_WHITESPACE)


def parse_json(target: Union[TypeAdapter[Parsed], type[BaseModel]], body: bytes) -> Any:
    """Validate raw JSON bytes against a wire model or adapter, raising `BodyInvalid`.

    The wire models are strict (no ``"5"`` or ``true`` for a number), but JSON Schema
    counts ``2.0`` as an integer: a body whose only problems are such whole-number
    floats is validated again in lax mode, where they become ints.
    """
    validate = target.validate_json if isinstance(target, TypeAdapter) else target.model_validate_json
    try:
        return validate(body)
    except ValidationError as exc:
        if not all(_whole_float_for_int(e) for e in exc.errors(include_url=False)):
            raise BodyInvalid(schema_problems(exc)) from None
    try:
        return validate(body, strict=False)
    except ValidationError as exc:
        raise BodyInvalid(schema_problems(exc)) from None


def _whole_float_for_int(error: Any) -> bool:
    value = error.get("input")
    return error["type"] == "int_type" and isinstance(value, float) and value.is_integer()


def check_group(group: ScoredData, level: str, where: str = "body") -> list[Problem]:
    """The cross-field checks of ``--validation`` `level` (see `atroposlib.api.group_checks`).

    Raises `BodyInvalid` for structural problems (every level but ``off``) and, in
    ``strict``, for quality problems; in ``warn`` returns the quality problems.
    """
    if level == "off":
        return []
    raise_if_any(structural_problems(group), where)
    problems = [
        Problem(p.reason, f"{where}.{p.field}", p.message) for p in quality_problems(group)
    ]
    if level == "strict":
        raise_if_any([(p.field, p.message) for p in problems], "")
    return problems


def raise_if_any(problems: list[tuple[str, str]], where: str) -> None:
    """Raise `BodyInvalid` naming each (field, message); `where` prefixes the fields."""
    if problems:
        prefix = where.split(".") if where else []
        raise BodyInvalid([
            {"type": "value_error", "loc": [*prefix, *name.split(".")], "msg": message}
            for name, message in problems
        ])


def summarize(group: ScoredData, level: str, where: str = "body") -> Submission:
    """Check a parsed group and summarise it for storage (raises `BodyInvalid`)."""
    problems = check_group(group, level, where)
    longest = max((len(tokens) for tokens in group.tokens), default=0)
    version = group_policy_version(
        {"tokens": group.tokens, "generation_params": group.generation_params, "overrides": group.overrides}
    )
    return Submission(len(group.tokens), group.env_id, group.submission_id, longest, problems, version)


def inspect_group_body(body: bytes, gzipped: bool, level: str, max_decompressed: int) -> Submission:
    """Decompress (when `gzipped`), parse and check one submitted group."""
    if gzipped:
        body = gunzip_capped(body, max_decompressed)
    return summarize(parse_json(ScoredData, body), level)
