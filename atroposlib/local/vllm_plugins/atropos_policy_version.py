"""Policy versions for a stock vLLM OpenAI server: loaded by ``atropos-vllm serve`` through
vLLM's ``--middleware atropos_policy_version.policy_version``.

It runs inside the vLLM runtime, where atroposlib is not installed, so it imports only what
vLLM's server already has. Every answer gets the ``X-Atropos-Policy-Version`` header (see
`atroposlib.policy_version`) with the version served when the request arrived; ``GET
/atropos/policy_version`` reads it and ``POST /atropos/policy_version {"policy_version": N}``
sets it, which whoever reloads the server's weights does after each reload. The version at
start is ``$ATROPOS_POLICY_VERSION`` (default 0).
"""

from __future__ import annotations

import json
import os
from typing import Any, Awaitable, Callable

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

POLICY_VERSION_HEADER = "X-Atropos-Policy-Version"
ROUTE = "/atropos/policy_version"

_version = int(os.environ.get("ATROPOS_POLICY_VERSION", "0") or 0)


def _set(body: Any) -> Response:
    global _version
    value = body.get("policy_version") if isinstance(body, dict) else None
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        return JSONResponse({"error": '"policy_version" must be an integer >= 0'}, status_code=400)
    _version = value
    return JSONResponse({"policy_version": _version})


async def policy_version(request: Request, call_next: Callable[[Request], Awaitable[Response]]) -> Response:
    """Answer the version route; stamp every other answer with the version at arrival."""
    arrived_at = _version
    if request.url.path == ROUTE:
        if request.method == "POST":
            try:
                response = _set(json.loads(await request.body() or b"null"))
            except ValueError:
                response = JSONResponse({"error": "the body must be JSON"}, status_code=400)
        else:
            response = JSONResponse({"policy_version": _version})
    else:
        response = await call_next(request)
    response.headers[POLICY_VERSION_HEADER] = str(arrived_at if request.url.path != ROUTE else _version)
    return response
