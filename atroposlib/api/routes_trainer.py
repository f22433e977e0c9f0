"""Endpoints a trainer calls: registration, batches (legacy and leased), run status, reset."""

from __future__ import annotations

import asyncio
import logging
import time
from itertools import groupby

import orjson
from fastapi import APIRouter, Query, Request
from starlette.responses import PlainTextResponse, Response

from atroposlib.api.contract import BODY_ERRORS, errors, json_body, text_response
from atroposlib.api.errors import ApiError
from atroposlib.api.items import served_items
from atroposlib.api.responses import (
    NO_STORE,
    batch_response,
    json_response,
    require_registered,
    runtime,
)
from atroposlib.api.validation import body_is_absent, parse_json
from atroposlib.wire import JSON_SAFE_INT, LeaseRequest, Registration

log = logging.getLogger("atroposlib.api")
router = APIRouter()

NOT_REGISTERED_BATCH = {
    "status": "error",
    "message": "Trainer not registered. Call /register first.",
    "batch": [],
}
LONG_POLL_INTERVAL_S = 0.05
CLIENT_GONE = 499  # nginx's "client closed request": logged, never delivered


@router.post(
    "/register", summary="Register the trainer's run configuration (first one wins)",
    description="`replace: true` (or `?replace=true`) replaces the stored configuration.",
    responses=errors(*BODY_ERRORS), openapi_extra=json_body(Registration),
)
async def register(request: Request) -> Response:
    registration = parse_json(Registration, await request.body())
    if request.query_params.get("replace", "").lower() in ("1", "true", "yes"):
        registration.replace = True
    return json_response(runtime(request).state.register(registration))


@router.get("/batch", summary="Pop and commit one batch (legacy; prefer POST /batch)")
async def get_batch(request: Request) -> Response:
    rt = runtime(request)
    if not rt.state.registered:
        return json_response(NOT_REGISTERED_BATCH, headers=NO_STORE)
    rt.state.mark_started()
    rt.housekeep()
    payloads = rt.dispatch.pop_batch()
    if payloads is None:
        return json_response({"batch": None}, headers=NO_STORE)
    return batch_response(payloads)


@router.post(
    "/batch",
    summary="Lease one batch; confirm it with /batch/{batch_id}/ack",
    description="409 until a trainer has registered.",
    responses=errors(*BODY_ERRORS, 409), openapi_extra=json_body(LeaseRequest, required=False),
)
async def lease_batch(request: Request) -> Response:
    body = await request.body()
    lease_request = LeaseRequest() if body_is_absent(body) else parse_json(LeaseRequest, body)
    rt = runtime(request)
    require_registered(rt)
    rt.state.mark_started()
    deadline = time.monotonic() + lease_request.wait_seconds
    while True:
        if await request.is_disconnected():  # a batch leased now would wait out its lease unseen
            return Response(status_code=CLIENT_GONE)
        rt.housekeep()
        leased = rt.dispatch.lease_batch(lease_request.lease_seconds, lease_request.client_id, lease_request.trains)
        if leased is not None or time.monotonic() >= deadline:
            break
        await asyncio.sleep(LONG_POLL_INTERVAL_S)
    if leased is None:
        return json_response({"batch_id": None, "batch": None}, headers=NO_STORE)
    lease, payloads = leased
    head = orjson.dumps({"batch_id": lease.batch_id, "step": lease.step,
                         "lease_expires_at": lease.expires_at})
    return batch_response(payloads, extra=head[1:-1] + b",")


@router.post(
    "/batch/{batch_id}/ack", summary="Confirm a leased batch: the step advances",
    responses=errors(404, 410, 422),
)
async def ack_batch(batch_id: str, request: Request) -> Response:
    return json_response(runtime(request).dispatch.ack(batch_id))


@router.post(
    "/batch/{batch_id}/nack", summary="Give a leased batch back to the head of the queue",
    description="409 for a batch that was already acknowledged.",
    responses=errors(404, 409, 422),
)
async def nack_batch(batch_id: str, request: Request) -> Response:
    return json_response(runtime(request).dispatch.nack(batch_id))


@router.get(
    "/batches/served", summary="Batches served recently (recover one lost in transit)",
    responses=errors(422),
)
async def served_batches(
    request: Request,
    since: int = Query(0, ge=-JSON_SAFE_INT, le=JSON_SAFE_INT, description="Smallest step to list"),
    limit: int = Query(10_000, ge=1, le=100_000, description="Most groups to return"),
) -> Response:
    rows = runtime(request).journal.served_batches(since, limit)
    batches = []
    for (batch_id, step), members in groupby(rows, key=lambda row: row[:2]):
        head = orjson.dumps({"batch_id": batch_id, "step": step})
        items = served_items([m[2] for m in members])
        batches.append(head[:-1] + b',"batch":[' + b",".join(items) + b"]}")
    return Response(b'{"batches":[' + b",".join(batches) + b"]}", media_type="application/json")


@router.get("/wandb_info", summary="W&B group and project of the run")
async def wandb_info(request: Request) -> Response:
    return json_response(runtime(request).state.wandb_info())


@router.get("/info", summary="Batch size and max token length of the run")
async def info(request: Request) -> Response:
    return json_response(runtime(request).state.info())


@router.get("/status", summary="Current step and queued groups")
async def status(request: Request) -> Response:
    rt = runtime(request)
    rt.housekeep()
    return json_response(rt.state.status())


@router.get(
    "/reset_data", summary="Wipe the run (legacy GET; answers plain text)",
    response_class=PlainTextResponse, responses=text_response("`Reset successful`"),
)
async def reset_data(request: Request) -> Response:
    rt = runtime(request)
    if rt.settings.disable_get_reset:
        # An empty Allow: no method is served at this path on this server.
        raise ApiError(405, "method_disabled", "GET /reset_data is disabled on this server: use POST /reset",
                       headers={"Allow": ""})
    _reset(request)
    return PlainTextResponse("Reset successful")


@router.post("/reset", summary="Wipe the run")
async def reset(request: Request) -> Response:
    _reset(request)
    return json_response({"status": "reset"})


def _reset(request: Request) -> None:
    caller = request.client.host if request.client else "unknown"
    runtime(request).state.reset()
    log.warning("run reset by %s", caller)
