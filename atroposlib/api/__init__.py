"""The trajectory API (`run-api`): a durable queue between environments and trainers.

``atroposlib.api:app`` is the ASGI application; `create_app` builds one from
`ApiSettings`. The packing helpers Atropos exported live in `atroposlib.api.utils`.
"""

from atroposlib.api.server import app, create_app
from atroposlib.api.settings import ApiSettings

__all__ = ["ApiSettings", "app", "create_app"]
