"""The structured error every failure the server detects itself is reported with.

Body shape: ``{"status": "error", "error": {"code", "message", "details"}}``; 422
responses also keep FastAPI's ``detail`` array so existing clients can read them.
"""

from __future__ import annotations

import json
from typing import Any, Optional

import orjson
from starlette.responses import Response


def dump_json(content: Any) -> bytes:
    """Encode a response body; integers beyond 64 bits (the trainer uuid, echoed client
    input) and other values orjson refuses fall back to the standard library."""
    try:
        return orjson.dumps(content)
    except TypeError:
        return json.dumps(content, default=str).encode()


class ApiError(Exception):
    """A client-visible failure with an HTTP status and a stable machine-readable code."""

    def __init__(
        self, status: int, code: str, message: str, details: Optional[dict[str, Any]] = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.details = details or {}

    def body(self) -> dict[str, Any]:
        return error_body(self.code, self.message, self.details)

    def response(self, headers: Optional[dict[str, str]] = None) -> Response:
        return Response(
            dump_json(self.body()),
            status_code=self.status,
            media_type="application/json",
            headers=headers,
        )


def error_body(code: str, message: str, details: Optional[dict[str, Any]] = None) -> dict[str, Any]:
    return {"status": "error", "error": {"code": code, "message": message, "details": details or {}}}


def validation_error(detail: list[dict[str, Any]], message: str) -> Response:
    """A 422 carrying both FastAPI's ``detail`` list and the structured error."""
    body = error_body("validation_error", message)
    body["detail"] = detail
    return Response(dump_json(body), status_code=422, media_type="application/json")


def describe_validation_problems(detail: list[dict[str, Any]]) -> str:
    """One line naming every offending field, e.g. ``body.scores.0: not a finite number``."""
    parts = []
    for problem in detail[:5]:
        location = ".".join(str(part) for part in problem.get("loc", ()))
        parts.append(f"{location}: {problem.get('msg', 'invalid')}")
    more = f" (+{len(detail) - 5} more)" if len(detail) > 5 else ""
    return "; ".join(parts) + more


class BodyInvalid(Exception):
    """A request body that failed schema validation; rendered as FastAPI's 422."""

    def __init__(self, detail: list[dict[str, Any]]) -> None:
        super().__init__(describe_validation_problems(detail))
        self.detail = detail

    def response(self) -> Response:
        return validation_error(self.detail, str(self))
