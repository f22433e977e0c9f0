"""Reading JSON out of HTTP responses with a useful log line when it fails."""

from __future__ import annotations

import inspect
import logging
from typing import Any, Optional

_default_log = logging.getLogger("atroposlib.http")


async def _maybe_await(value: Any) -> Any:
    return await value if inspect.isawaitable(value) else value


async def parse_http_response(resp: Any, logger: Optional[logging.Logger] = None) -> Any:
    """The JSON body of `resp` (an aiohttp or httpx response) after `raise_for_status()`.

    On any failure the status, the error and the body text are logged and the exception
    is re-raised unchanged, so retry decorators around the call still see it.
    """
    try:
        resp.raise_for_status()
        return await _maybe_await(resp.json())
    except Exception as exc:
        status = getattr(resp, "status", None) or getattr(resp, "status_code", None)
        try:
            body = await _maybe_await(resp.text() if callable(resp.text) else resp.text)
        except Exception:  # the body may be unreadable (closed connection); the log line must still happen
            body = "<unreadable>"
        (logger or _default_log).error("HTTP response %s failed: %s; body: %.2000s", status, exc, body)
        raise
