"""The trajectory API (`run-api`): a durable queue between environments and trainers.

``atroposlib.api:app`` is the ASGI application; `create_app` builds one from
`ApiSettings`. The packing helpers Atropos exported live in `atroposlib.api.utils`.

The three names load on first use, so importing one of the package's modules (as the
validator worker processes do) does not import FastAPI and build the module-level app.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from atroposlib.api.server import app, create_app
    from atroposlib.api.settings import ApiSettings

__all__ = ["ApiSettings", "app", "create_app"]
_HOMES = {"app": "atroposlib.api.server", "create_app": "atroposlib.api.server", "ApiSettings": "atroposlib.api.settings"}


def __getattr__(name: str) -> Any:
    if name not in _HOMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(_HOMES[name]), name)
