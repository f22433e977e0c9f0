"""The API's documented contract: request bodies, status codes and content types.

Routes declare what they always answer (`errors`, `json_body`); `openapi_for` adds what
depends on the server's settings: the group schema of the ``--validation`` level, 401
and the bearer scheme with ``--api-key``, 415 in ``strict``, 405 on ``GET /reset_data``
with ``--disable-get-reset``. Schemathesis checks in the test suite that the server
answers exactly as documented.
"""

from __future__ import annotations

import copy
from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel

from atroposlib.api.settings import ApiSettings
from atroposlib.wire import TOKEN_ID_LIMIT, ErrorResponse, ScoredData

ERROR_DESCRIPTIONS = {
    400: "Body declared gzip but not valid gzip (invalid_gzip)",
    401: "Missing or wrong API key (unauthorized)",
    404: "Unknown env id, batch id or resource",
    405: "Method disabled on this server (method_disabled)",
    409: "Conflicts with the run's state (not registered, settled lease, too long for the trainer)",
    410: "Lease expired; its groups went back to the queue (lease_expired)",
    413: "Body larger than --max-body-bytes, or than --max-decompressed-bytes once gunzipped",
    415: "Body not declared as JSON (Content-Type) under --validation strict",
    422: "Invalid request: the message and `detail` name each offending field",
    503: "The state journal failed (storage_error)",
}
# Every request body may be gzip-encoded and is size-capped.
BODY_ERRORS = (400, 413, 422)
SCORED_DATA_REF = {"$ref": "#/components/schemas/ScoredData"}
PUBLIC_OPERATIONS = {("get", "/"), ("get", "/health")}
SECURITY_SCHEME = "bearerAuth"


def errors(*codes: int) -> dict[int | str, dict[str, Any]]:
    """The ``responses`` entries of the structured errors `codes`."""
    return {code: {"model": ErrorResponse, "description": ERROR_DESCRIPTIONS[code]} for code in codes}


def json_body(schema: dict[str, Any] | type[BaseModel], required: bool = True) -> dict[str, Any]:
    """``openapi_extra`` declaring a JSON request body (handlers parse it themselves)."""
    if isinstance(schema, type):
        schema = schema.model_json_schema()
    return {"requestBody": {"required": required, "content": {"application/json": {"schema": schema}}}}


def text_response(description: str) -> dict[int | str, dict[str, Any]]:
    """``responses`` entry of a plain-text 200."""
    return {200: {"description": description, "content": {"text/plain": {"schema": {"type": "string"}}}}}


def group_schema(level: str) -> dict[str, Any]:
    """The JSON Schema of a submitted group as ``--validation`` `level` checks it.

    What JSON Schema can say is here (non-empty groups, ``env_id >= 0``; in ``strict``
    non-empty sequences and token ids in range); equal lengths across fields cannot be
    said in it and are described in the field descriptions.
    """
    schema = copy.deepcopy(ScoredData.model_json_schema())
    props = schema["properties"]
    props["tokens"]["description"] = "Token ids, one list per sequence."
    props["masks"]["description"] = (
        "One label per token: the token id where trained on, -100 elsewhere; one list per sequence."
    )
    props["scores"]["description"] = "One score per sequence."
    if level == "off":
        return schema
    for key in ("tokens", "masks", "scores"):
        props[key]["minItems"] = 1
    env_id = next(option for option in props["env_id"]["anyOf"] if option.get("type") == "integer")
    env_id["minimum"] = 0
    if level == "strict":
        props["tokens"]["items"]["minItems"] = 1
        props["tokens"]["items"]["items"].update(minimum=0, maximum=TOKEN_ID_LIMIT - 1)
        props["masks"]["items"]["minItems"] = 1
    return schema


def openapi_for(app: FastAPI, settings: ApiSettings) -> dict[str, Any]:
    """The OpenAPI document of `app` configured with `settings`."""
    schema = get_openapi(
        title=app.title, version=app.version, description=app.description, routes=app.routes
    )
    schema.setdefault("components", {}).setdefault("schemas", {})["ScoredData"] = group_schema(
        settings.validation
    )
    protected = bool(settings.resolved_api_key())
    if protected:
        schema["components"]["securitySchemes"] = {SECURITY_SCHEME: {"type": "http", "scheme": "bearer"}}
    for path, operations in schema["paths"].items():
        for method, operation in operations.items():
            # Any request may carry a body, which the middleware caps and gunzips.
            added: list[int] = [400, 413, 503]
            if protected and (method, path) not in PUBLIC_OPERATIONS and not (
                settings.metrics_public and path == "/metrics"
            ):
                operation["security"] = [{SECURITY_SCHEME: []}]
                added.append(401)
            if settings.validation == "strict" and "requestBody" in operation:
                added.append(415)
            if settings.disable_get_reset and (method, path) == ("get", "/reset_data"):
                added.append(405)
            for code in added:
                operation["responses"][str(code)] = {
                    "description": ERROR_DESCRIPTIONS[code],
                    "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorResponse"}}},
                }
    return schema


def install_contract(app: FastAPI, settings: ApiSettings) -> None:
    """Serve `openapi_for(app, settings)` (built once) at the app's OpenAPI URL."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = openapi_for(app, settings)
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
