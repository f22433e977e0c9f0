"""Endpoints an environment calls: registration, status polling and submissions."""

from __future__ import annotations

from typing import Any, Optional

from fastapi import APIRouter, Request
from pydantic import TypeAdapter
from starlette.responses import Response

from atroposlib.api.contract import BODY_ERRORS, SCORED_DATA_REF, errors, json_body
from atroposlib.api.errors import ApiError, BodyInvalid
from atroposlib.api.items import item_json, served_item
from atroposlib.api.middleware import GZIP_BODY_SCOPE_KEY
from atroposlib.api.responses import json_response, read_body, runtime
from atroposlib.api.validation import InvalidGzip, PayloadTooLarge, body_is_absent, parse_json, summarize
from atroposlib.wire import EnvIdentifier, RegisterEnv, ScoredData

router = APIRouter()

_GROUP_LIST = TypeAdapter(list[ScoredData])
EMPTY_EXAMPLE = {
    "tokens": [], "masks": [], "scores": [], "advantages": [], "ref_logprobs": [],
    "generation_params": [], "inference_logprobs": [], "messages": [], "images": [],
}
IDEMPOTENCY_KEY = {
    "name": "Idempotency-Key", "in": "header", "required": False,
    "description": "A retry with the same key is stored once and answered like the first.",
    "schema": {"type": "string", "minLength": 1, "maxLength": 128},
}
# 404 / 409: an unregistered env id, or a sequence longer than the trainer's max_token_len,
# under --validation strict.
SUBMISSION_ERRORS = errors(*BODY_ERRORS, 404, 409)


def _idempotency_key(request: Request) -> Optional[str]:
    key = request.headers.get("idempotency-key")
    if key is not None and not 0 < len(key) <= 128:
        raise ApiError(422, "validation_error", "Idempotency-Key must be 1 to 128 characters")
    return key


@router.post(
    "/scored_data", summary="Submit one scored group", responses=SUBMISSION_ERRORS,
    openapi_extra={**json_body(SCORED_DATA_REF), "parameters": [IDEMPOTENCY_KEY]},
)
async def scored_data(request: Request) -> Response:
    body = await request.body()
    rt = runtime(request)
    gzipped = bool(request.scope.get(GZIP_BODY_SCOPE_KEY))
    try:
        submission = await rt.validators.inspect(body, gzipped)
    except InvalidGzip:
        raise ApiError(400, "invalid_gzip", "Invalid gzip payload") from None
    except PayloadTooLarge:
        raise ApiError(413, "payload_too_large", "decompressed request body is too large") from None
    key = _idempotency_key(request) or submission.submission_id
    rt.intake.review(submission)
    with rt.state.journal.transaction():
        response = rt.intake.submit(submission, key, stored=body)
    return json_response(response)


@router.post(
    "/scored_data_list", summary="Submit several scored groups (all or none)", responses=SUBMISSION_ERRORS,
    openapi_extra={**json_body({"type": "array", "items": SCORED_DATA_REF}), "parameters": [IDEMPOTENCY_KEY]},
)
async def scored_data_list(request: Request) -> Response:
    groups = await read_body(request, _GROUP_LIST)
    rt = runtime(request)
    state = rt.state
    list_key = _idempotency_key(request)
    submissions = []
    for i, group in enumerate(groups):
        submission = summarize(group, state.settings.validation, f"body.{i}")
        rt.intake.review(submission, f"body.{i}")
        submissions.append(submission)
    # Checked after validation: a key never makes an invalid body acceptable.
    repeated = rt.intake.repeat_answer(list_key)
    if repeated is not None:
        return json_response(repeated)
    summary: dict[str, Any] = {"status": "received", "groups_processed": len(groups)}
    buffered, duplicates, warnings = 0, 0, []
    with state.journal.transaction():
        for group, submission in zip(groups, submissions):
            result = rt.intake.submit(submission, submission.submission_id, stored=item_json(group))
            duplicates += bool(result.get("duplicate"))
            warnings += result.get("warnings", [])
            if result["status"] == "buffered":
                buffered += 1
                summary["last_buffer_size"] = result["buffer_size"]
        if buffered:
            summary["buffered"] = buffered
        if duplicates:
            summary["duplicates"] = duplicates
        if warnings:
            summary["warnings"] = warnings
        if list_key is not None:
            rt.intake.remember(list_key, summary)
    return json_response(summary)


@router.post(
    "/register-env", summary="Register an environment process (after the trainer's first /batch)",
    responses=errors(*BODY_ERRORS), openapi_extra=json_body(RegisterEnv),
)
async def register_env(request: Request) -> Response:
    registration = await read_body(request, RegisterEnv)
    return json_response(runtime(request).state.register_env(registration))


@router.post(
    "/disconnect-env", summary="Mark an environment as gone (an unknown id answers status 'failure')",
    responses=errors(*BODY_ERRORS), openapi_extra=json_body(EnvIdentifier),
)
async def disconnect_env(request: Request) -> Response:
    env = await read_body(request, EnvIdentifier)
    return json_response(runtime(request).state.disconnect_env(env.env_id))


@router.post(
    "/heartbeat-env", summary="Tell the server an environment is alive",
    responses=errors(*BODY_ERRORS, 404), openapi_extra=json_body(EnvIdentifier),
)
async def heartbeat_env(request: Request) -> Response:
    env = await read_body(request, EnvIdentifier)
    state = runtime(request).state
    if state.env_index(env.env_id) is None:
        raise ApiError(404, "unknown_env", f"env_id {env.env_id} is not registered", {"env_id": env.env_id})
    state.touch_env(env.env_id)
    return json_response({"status": "ok"})


_STATUS_ENV_DOC: dict[str, Any] = dict(
    summary="Queue numbers an environment throttles itself by",
    description="The env id comes in a JSON body, as Atropos envs send it even with GET; "
    "`?env_id=N` is accepted instead of the body (both must agree when both are given). "
    "409 until a trainer has registered, 404 for an env id that is not registered.",
    responses=errors(*BODY_ERRORS, 404, 409),
    openapi_extra=json_body(EnvIdentifier),
)


@router.get("/status-env", operation_id="status_env_get", **_STATUS_ENV_DOC)
@router.post("/status-env", operation_id="status_env_post", **_STATUS_ENV_DOC)
async def status_env(request: Request) -> Response:
    body = await request.body()
    from_body = None if body_is_absent(body) else parse_json(EnvIdentifier, body).env_id
    raw_query = request.query_params.get("env_id")
    from_query = None
    if raw_query is not None:
        try:
            from_query = int(raw_query)
        except ValueError:
            raise BodyInvalid([{"type": "int_parsing", "loc": ["query", "env_id"],
                                "msg": "Input should be a valid integer", "input": raw_query}]) from None
    if from_body is not None and from_query is not None and from_body != from_query:
        raise ApiError(422, "validation_error", f"env_id {from_query} in the query disagrees with {from_body} in the body")
    env_id = from_body if from_body is not None else from_query
    if env_id is None:
        raise BodyInvalid([{"type": "missing", "loc": ["body", "env_id"], "msg": "Field required", "input": None}])
    rt = runtime(request)
    rt.housekeep()
    return json_response(rt.state.status_env(env_id))


@router.get("/latest_example", summary="The most recently queued group")
async def latest_example(request: Request) -> Response:
    state = runtime(request).state
    if state.latest_seq is None:
        return json_response(EMPTY_EXAMPLE)
    payloads = state.journal.item_payloads([state.latest_seq])
    if not payloads:
        return json_response(EMPTY_EXAMPLE)
    return Response(served_item(payloads[0]), media_type="application/json")
