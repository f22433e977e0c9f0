"""The bundled vLLM server's ``/bridge/*`` routes: Atropos's shared-weights (CUDA IPC) API.

This server shares no weights with the trainer, so the routes report the engine's state
(model, dtype, reloads, policy version) and pause, resume, sleep or wake the engine where
vLLM can, answering ``{"status": "not_supported", ...}`` where it cannot. The trainer
pauses generation here while it trains on the same CPU cores. Like ``openai_routes.py``
it imports only vLLM, FastAPI and the standard library (it runs in vLLM's python).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Callable, Literal

from fastapi import APIRouter, Request
from vllm.platforms import current_platform
from vllm.v1.engine.async_llm import AsyncLLM
from vllm.version import __version__ as VLLM_VERSION

NOT_SHARED = "this server shares no weights with the trainer (CUDA IPC needs a GPU and patched vLLM)"
NO_SLEEP_MODE = {"status": "not_supported", "detail": "start the server with --enable-sleep-mode (GPU only)"}


@dataclass(frozen=True)
class BridgeHooks:
    """What the routes take from the server: its engine (raising 503 before it runs), whether
    one runs, and its weight-update counters (``update_count``, ``policy_version``,
    ``last_update_time``)."""

    engine: Callable[[], AsyncLLM]
    engine_running: Callable[[], bool]
    updates: Callable[[], dict[str, Any]]


def bridge_router(hooks: BridgeHooks) -> APIRouter:
    """The ``/bridge/*`` routes over the server's engine."""
    router = APIRouter(prefix="/bridge")

    def model_summary() -> dict[str, Any]:
        config = hooks.engine().model_config
        return {"model": str(config.model), "dtype": str(config.dtype)}

    def sleep_mode() -> bool:
        return bool(hooks.engine().model_config.enable_sleep_mode)

    @router.get("/info")
    async def bridge_info() -> dict[str, Any]:
        return {"enabled": False, "shared_weights": False, **hooks.updates(), "model_name": model_summary()["model"],
                "device": current_platform.device_type, "detail": NOT_SHARED}

    @router.get("/state_dict_info")
    async def bridge_state_dict_info() -> dict[str, Any]:
        return {**model_summary(), "shared_weights_enabled": False}

    @router.post("/pause")
    async def bridge_pause(mode: Literal["wait", "keep"] = "wait") -> dict[str, Any]:
        """Stop scheduling generation: ``wait`` lets requests in flight finish first (Atropos's),
        ``keep`` freezes them where they are until ``/bridge/resume`` (instant: the trainer's
        pause while it trains on the same CPU cores)."""
        await hooks.engine().pause_generation(mode=mode, clear_cache=False)
        return {"status": "paused"}

    @router.post("/resume")
    async def bridge_resume() -> dict[str, Any]:
        await hooks.engine().resume_generation()
        return {"status": "resumed"}

    @router.get("/is_paused")
    async def bridge_is_paused() -> dict[str, Any]:
        return {"paused": await hooks.engine().is_paused()}

    @router.post("/sleep")
    async def bridge_sleep() -> dict[str, Any]:
        if not sleep_mode():
            return NO_SLEEP_MODE
        await hooks.engine().sleep()
        return {"status": "sleeping"}

    @router.post("/wake_up")
    async def bridge_wake_up() -> dict[str, Any]:
        if not sleep_mode():
            return NO_SLEEP_MODE
        await hooks.engine().wake_up()
        return {"status": "awake"}

    @router.get("/is_sleeping")
    async def bridge_is_sleeping() -> dict[str, Any]:
        return {"sleeping": await hooks.engine().is_sleeping()}

    @router.get("/debug")
    async def bridge_debug() -> dict[str, Any]:
        running = hooks.engine_running()
        return {"engine_type": type(hooks.engine()).__name__ if running else None, "vllm_version": VLLM_VERSION,
                "patches_applied": False, "device": current_platform.device_type,
                "logdir": os.environ.get("LOGDIR", "unset"), "model_config": model_summary() if running else None}

    @router.get("/list_endpoints")
    async def bridge_list_endpoints(request: Request) -> dict[str, Any]:
        return {"endpoints": [{"path": route.path, "methods": sorted(route.methods)}
                              for route in request.app.routes if getattr(route, "methods", None)]}

    return router
