"""The structured error every failure the server detects itself is reported with.

Body shape: ``{"status": "error", "error": {"code", "message", "details"}}``; 422
responses also keep FastAPI's ``detail`` array so existing clients can read them.
"""

from __future__ import annotations

import json
from typing import Any, Optional

import orjson
from starlette.responses import Response

from atroposlib.api.validation import BodyInvalid, describe_validation_problems

__all__ = ["ApiError", "BodyInvalid", "describe_validation_problems", "dump_json", "error_body", "validation_error"]


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
        self, status: int, code: str, message: str, details: Optional[dict[str, Any]] = None,
        headers: Optional[dict[str, str]] = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.details = details or {}
        self.headers = headers

    def body(self) -> dict[str, Any]:
        return error_body(self.code, self.message, self.details)

    def response(self, headers: Optional[dict[str, str]] = None) -> Response:
        return Response(
            dump_json(self.body()),
            status_code=self.status,
            media_type="application/json",
            headers=headers if headers is not None else self.headers,
        )


def not_registered() -> ApiError:
    """The error of endpoints that need a registered trainer."""
    return ApiError(409, "not_registered", "no trainer has registered: call /register first")


def error_body(code: str, message: str, details: Optional[dict[str, Any]] = None) -> dict[str, Any]:
    return {"status": "error", "error": {"code": code, "message": message, "details": details or {}}}


def validation_error(detail: list[dict[str, Any]], message: str) -> Response:
    """A 422 carrying both FastAPI's ``detail`` list and the structured error."""
    body = error_body("validation_error", message)
    body["detail"] = detail
    return Response(dump_json(body), status_code=422, media_type="application/json")
