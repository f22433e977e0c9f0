"""Endpoints for operators: liveness, health, Prometheus metrics and the env table."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from starlette.responses import PlainTextResponse, Response

from atroposlib.api.contract import text_response
from atroposlib.api.metrics import CONTENT_TYPE
from atroposlib.api.responses import json_response, runtime
from atroposlib.api.runtime import Runtime

router = APIRouter()


@router.get("/", summary="Service name")
async def root() -> Response:
    return json_response({"message": "AtroposLib API"})


def _warnings(rt: Runtime) -> list[str]:
    warnings = []
    reason = rt.dispatch.unpackable_reason()
    if reason:
        warnings.append(reason)
    dead = sum(rt.state.dead_letters.values())
    if dead:
        warnings.append(f"{dead} group(s) dead-lettered after repeated lease expiry (see /envs)")
    stale = _recent_stale_drop(rt)
    if stale:
        warnings.append(stale)
    return warnings


STALE_WARNING_SECONDS = 120.0


def _recent_stale_drop(rt: Runtime) -> str:
    """A warning while fresh groups are dropped as stale and no batch is out to a trainer: the
    inference server's weights are steps behind the API's step, as when a trainer restarted
    at step 0 against a run the API holds at a later step."""
    state = rt.state
    if state.last_stale_drop is None or state.leased_batches():
        return ""
    when, groups, newest, step = state.last_stale_drop
    if state.clock() - when > STALE_WARNING_SECONDS:
        return ""
    return (f"{groups} group(s) dropped as stale {state.clock() - when:.0f} s ago: sampled by policy version {newest} "
            f"or older, the API is at step {step} (max_staleness {state.max_staleness}); a trainer whose step is "
            "behind the API's waits for ever: resume it from its checkpoint of the API's step (see current_step)")


@router.get("/health", summary="Health summary (no authentication needed)")
async def health(request: Request) -> Response:
    rt = runtime(request)
    rt.housekeep()
    state = rt.state
    warnings = _warnings(rt)
    return json_response({
        "status": "degraded" if warnings else "ok",
        "registered": state.registered,
        "started": state.started,
        "durable": rt.journal.durable,
        "current_step": state.step,
        "queue_groups": len(state.pending.sizes),
        "queue_sequences": state.pending.sizes.total,
        "buffered_sequences": state.buffered_sequences(),
        "leased_batches": state.leased_batches(),
        "envs_connected": sum(e.connected for e in state.envs),
        "uptime_s": round(state.clock() - state.started_at, 1),
        "warnings": warnings,
    })


@router.get("/envs", summary="Registered environments and dead-lettered batches")
async def envs(request: Request) -> Response:
    rt = runtime(request)
    rt.housekeep()
    state = rt.state
    now = state.clock()
    listed: list[dict[str, Any]] = [
        {
            "env_id": e.registered_id,
            "real_name": e.real_name,
            "connected": e.connected,
            "last_seen_s": round(now - e.last_update, 3),
            "group_size": e.group_size,
            "weight": e.weight,
            "min_batch_allocation": e.min_batch_allocation,
            "queued_sequences": state.pending.sequences_of(e.registered_id),
            "buffered_sequences": state.buffered_sequences(e.registered_id),
        }
        for e in state.envs
    ]
    dead = [{"batch_id": b, "groups": n} for b, n in rt.state.dead_letters.items()]
    return json_response({"envs": listed, "dead_letters": dead})


@router.get(
    "/metrics", summary="Prometheus metrics", response_class=PlainTextResponse,
    responses=text_response("Prometheus text exposition format (version 0.0.4)"),
)
async def metrics(request: Request) -> Response:
    rt = runtime(request)
    rt.housekeep()
    state, m = rt.state, rt.metrics
    m.current_step.set(state.step)
    m.queue_groups.set(len(state.pending.sizes))
    m.lease_outstanding.set(state.leased_batches())
    m.unpackable.set(1 if rt.dispatch.unpackable_reason() else 0)
    m.dead_letter_groups.set(sum(state.dead_letters.values()))
    env_ids = {e.registered_id for e in state.envs} | set(state.pending.by_env)
    for env_id in env_ids:
        label = state.env_label(env_id)
        m.queue_sequences.labels(env=label).set(state.pending.sequences_of(env_id))
        m.buffer_sequences.labels(env=label).set(
            state.buffered_sequences(env_id) if env_id is not None else 0
        )
    for e in state.envs:
        m.env_connected.labels(env=e.real_name).set(1 if e.connected else 0)
    return Response(m.render(), media_type=CONTENT_TYPE)
