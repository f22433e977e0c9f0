"""Response helpers shared by the route modules."""

from __future__ import annotations

from typing import Any, Optional

from pydantic import BaseModel, TypeAdapter
from starlette.requests import Request
from starlette.responses import Response

from atroposlib.api.errors import dump_json, not_registered
from atroposlib.api.runtime import Runtime
from atroposlib.api.validation import parse_json

NO_STORE = {"Cache-Control": "no-store"}


def json_response(content: Any, status: int = 200, headers: Optional[dict[str, str]] = None) -> Response:
    return Response(dump_json(content), status_code=status, media_type="application/json", headers=headers)


def batch_response(payloads: list[bytes], extra: bytes = b"") -> Response:
    """``{<extra>"batch": [...]}`` assembled from stored item JSON without re-encoding."""
    body = b'{' + extra + b'"batch":[' + b",".join(payloads) + b"]}"
    return Response(body, media_type="application/json", headers=NO_STORE)


def runtime(request: Request) -> Runtime:
    return request.app.state.runtime()


async def read_body(request: Request, target: TypeAdapter[Any] | type[BaseModel]) -> Any:
    """The request's JSON body validated against a wire model (raises `BodyInvalid`)."""
    return parse_json(target, await request.body())


def require_registered(runtime_: Runtime) -> None:
    if not runtime_.state.registered:
        raise not_registered()
