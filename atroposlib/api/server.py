"""The trajectory API application: environments push scored groups, trainers pull batches.

`create_app(settings)` builds an app; the module-level `app` is configured from the
environment (``ATROPOS_API_SETTINGS`` as JSON, which `run-api --reload` uses, or the
individual ``ATROPOS_API_*`` variables) and opens its state on first use.
"""

from __future__ import annotations

import logging
import os
import re
import threading
import uuid
from contextlib import asynccontextmanager
import time
from typing import Any, AsyncIterator, Callable, Optional

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi_offline import FastAPIOffline
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.middleware.cors import CORSMiddleware
from starlette.responses import Response
from starlette.routing import BaseRoute, compile_path

from atroposlib.api import routes_env, routes_ops, routes_trainer
from atroposlib.api.contract import install_contract
from atroposlib.api.errors import ApiError, BodyInvalid, describe_validation_problems, validation_error
from atroposlib.api.metrics import ApiMetrics
from atroposlib.api.middleware import BearerAuth, BodyLimits, CompressedResponses, DurableResponses, JsonBodies
from atroposlib.api.runtime import Runtime
from atroposlib.api.settings import ApiSettings
from atroposlib.api.status_math import MIN_ENV_WEIGHT
from atroposlib.wire import EnvIdentifier, RegisterEnv, Registration, ScoredData

__all__ = [
    "MIN_ENV_WEIGHT",
    "EnvIdentifier",
    "RegisterEnv",
    "Registration",
    "ScoredData",
    "app",
    "create_app",
]

log = logging.getLogger("atroposlib.api")

# Level 1 compresses batch JSON about 4x at a fraction of the cost of level 9.
RESPONSE_GZIP_LEVEL = 1
RESPONSE_GZIP_MIN_BYTES = 1000
PUBLIC_PATHS = {"/", "/health"}
SUBMISSION_PATHS = frozenset({"/scored_data", "/scored_data_list"})
# Swagger UI (/docs), ReDoc (/redoc) and their assets come from the installed package,
# not a CDN, so the docs work offline; documentation needs no API key.
DOCS_ASSETS_URL = "/docs-assets"
DOCUMENTATION_PATHS = {"/docs", "/docs/oauth2-redirect", "/redoc", "/openapi.json"}


def create_app(
    settings: Optional[ApiSettings] = None, clock: Callable[[], float] = time.time
) -> FastAPI:
    """A new API application; its state opens on start-up (or on the first request).

    `clock` (seconds) drives leases, liveness and buffer ages; tests pass a fake one.
    """
    settings = settings or ApiSettings()
    metrics = ApiMetrics()
    holder: dict[str, Runtime] = {}
    opening = threading.Lock()

    def get_runtime() -> Runtime:
        if "runtime" not in holder:
            with opening:
                if "runtime" not in holder:
                    holder["runtime"] = Runtime(settings, metrics, clock)
        return holder["runtime"]

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        get_runtime()  # opens the state (replaying its journal) before the first connection
        yield
        if "runtime" in holder:
            holder.pop("runtime").close()

    app = FastAPIOffline(
        title="AtroposLib API",
        version="0.4.1",
        lifespan=lifespan,
        description="Trajectory API: environments submit scored groups, trainers take batches.",
        static_url=DOCS_ASSETS_URL,
    )
    app.state.runtime = get_runtime
    app.state.settings = settings
    # Route matching walks the table in order: the hot submission routes go first, the
    # documentation routes FastAPIOffline added last.
    documentation = list(app.router.routes)
    app.router.routes.clear()
    routers = (routes_env.router, routes_trainer.router, routes_ops.router)
    for router in routers:
        app.include_router(router)
    app.router.routes.extend(documentation)
    app.state.methods_by_path = _methods_by_path(
        [*(route for router in routers for route in router.routes), *documentation]
    )
    install_contract(app, settings)
    _install_error_handlers(app, metrics)
    _install_middleware(app, settings, metrics, get_runtime)
    return app


def _install_middleware(
    app: FastAPI, settings: ApiSettings, metrics: ApiMetrics, runtime: Callable[[], Runtime]
) -> None:
    # Added innermost first: the last one added sees the request first.
    app.add_middleware(DurableResponses, journal=lambda: runtime().journal)
    app.add_middleware(
        JsonBodies, level=settings.validation,
        on_accepted=lambda problem: runtime().ledger.record([problem]),
        on_refused=lambda _: metrics.rejected.labels(reason="unsupported_media_type").inc(),
    )
    app.add_middleware(
        CompressedResponses, small_response_paths=SUBMISSION_PATHS,
        minimum_size=RESPONSE_GZIP_MIN_BYTES, compresslevel=RESPONSE_GZIP_LEVEL,
    )
    app.add_middleware(
        BodyLimits,
        max_body_bytes=settings.max_body_bytes,
        max_decompressed_bytes=settings.max_decompressed_bytes,
        on_body=lambda path, size: metrics.request_bytes.labels(endpoint=path).inc(size),
        deferred_gzip_paths=frozenset({"/scored_data"}),
    )
    api_key = settings.resolved_api_key()
    if api_key:
        public = PUBLIC_PATHS | DOCUMENTATION_PATHS | ({"/metrics"} if settings.metrics_public else set())
        app.add_middleware(BearerAuth, api_key=api_key, public_paths=public, public_prefixes=(DOCS_ASSETS_URL + "/",))
    origins = settings.cors_origin_list()
    if origins:
        app.add_middleware(
            CORSMiddleware,
            allow_origins=origins,
            allow_credentials="*" not in origins,
            allow_methods=["*"],
            allow_headers=["*"],
        )


def _install_error_handlers(app: FastAPI, metrics: ApiMetrics) -> None:
    @app.exception_handler(ApiError)
    async def on_api_error(_: Request, exc: ApiError) -> Response:
        metrics.rejected.labels(reason=exc.code).inc()
        return exc.response()

    @app.exception_handler(BodyInvalid)
    async def on_body_invalid(_: Request, exc: BodyInvalid) -> Response:
        metrics.rejected.labels(reason="validation_error").inc()
        return validation_error(exc.detail, str(exc))

    @app.exception_handler(RequestValidationError)
    async def on_validation_error(_: Request, exc: RequestValidationError) -> Response:
        metrics.rejected.labels(reason="validation_error").inc()
        detail = [
            {k: v for k, v in e.items() if k in ("type", "loc", "msg", "input")}
            for e in exc.errors()
        ]
        return validation_error(detail, describe_validation_problems(detail))

    @app.exception_handler(StarletteHTTPException)
    async def on_http_error(request: Request, exc: StarletteHTTPException) -> Response:
        headers = getattr(exc, "headers", None)
        if exc.status_code == 405:
            allowed = allowed_methods(request)
            if request.method == "OPTIONS":
                return Response(status_code=204, headers={"Allow": ", ".join([*allowed, "OPTIONS"])})
            headers = {"Allow": ", ".join(allowed)}
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
        return ApiError(exc.status_code, code, str(exc.detail)).response(headers=headers)

    @app.exception_handler(Exception)
    async def on_unexpected(request: Request, exc: Exception) -> Response:
        request_id = uuid.uuid4().hex[:12]
        log.exception("internal error (request %s) on %s %s", request_id, request.method, request.url.path)
        return ApiError(500, "internal_error", f"internal error; request id {request_id}",
                        {"request_id": request_id}).response()


def _methods_by_path(routes: list[BaseRoute]) -> list[tuple[re.Pattern[str], frozenset[str]]]:
    """(path pattern, methods) of every route that serves fixed methods."""
    table = []
    for route in routes:
        path, methods = getattr(route, "path", None), getattr(route, "methods", None)
        if path and methods:
            table.append((compile_path(path)[0], frozenset(methods)))
    return table


def allowed_methods(request: Request) -> list[str]:
    """The methods some route serves at the request's path (sorted), for ``Allow``."""
    methods: set[str] = set()
    for pattern, served in request.app.state.methods_by_path:
        if pattern.match(request.url.path):
            methods |= served
    return sorted(methods)


def settings_from_environment() -> ApiSettings:
    """Settings for the module-level app: ``ATROPOS_API_SETTINGS`` JSON, else defaults
    (the API key and state dir still come from their own variables)."""
    raw = os.environ.get("ATROPOS_API_SETTINGS")
    data: dict[str, Any] = ApiSettings.model_validate_json(raw).model_dump() if raw else {}
    if os.environ.get("ATROPOS_API_EPHEMERAL", "").lower() in ("1", "true", "yes"):
        data["ephemeral"] = True
    return ApiSettings(**data)


app = create_app(settings_from_environment())
