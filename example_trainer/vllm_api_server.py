"""The trainer's vLLM server: one vLLM engine behind the small HTTP API that RL training uses.

    python vllm_api_server.py --model DIR [--port 9001] [--host 127.0.0.1] [--api-key KEY] [vLLM engine flags]

It runs in a python where vLLM imports (on a CPU machine, the runtime `atropos-vllm install`
made), so it imports only vLLM, FastAPI, uvicorn, pydantic, the standard library and its
siblings `openai_routes.py` and `bridge_routes.py` (keep the three files together). The routes keep the names and
answers of Atropos's bundled server:

- ``GET /health`` answers 200 once the engine is loaded and HTTP is up; ``GET /health_generate``
  runs a one-token generation (503 before the engine exists, 500 when it fails).
- ``POST /generate``: ``prompt`` (text, or ``{"prompt_token_ids": [...]}``), optional ``stream``,
  every other key a vLLM sampling parameter. The answer has the completions' ``text``, the
  ``prompt``, ``finish_reasons``, ``prompt_token_ids`` and ``token_ids``; with ``logprobs``
  also per completion and position ``[{"<id>": logprob}]``, with ``prompt_logprobs`` per
  prompt position ``{"<id>": logprob}`` (``null`` for the first). A client that hangs up
  gets 499 and its request is aborted.
- ``POST /reload_weights {"weights_path": DIR, "policy_version": N}``: new weights of the
  same architecture, in place: requests in flight finish on the old weights, the next ones
  wait and then see only the new (the trainer's ``reload`` weight-bridge mode). On a server
  frozen by ``/bridge/pause?mode=keep`` nothing is drained: it is reloaded frozen and stays
  so, and its frozen requests go on after ``/bridge/resume`` with the new weights, their
  tokens so far recomputed on them (an in-flight weight update, as PipelineRL's). A tied LM
  head gets the new embedding too (atroposlib's ``vllm_plugins/atropos_worker.py``, loaded
  into vLLM's workers: vLLM's own reload keeps the old head).
- ``/lora/status``, ``/lora/load``, ``/lora/unload``: the adapter later ``/generate`` (and
  OpenAI route) calls use.

Log-probabilities are those of the distribution tokens are drawn from (after temperature,
min-p, top-k and top-p: ``--logprobs-mode processed_logprobs`` unless the command line says
otherwise), which is what a trainer's importance ratio needs. The server knows its *policy
version* (``--policy-version`` at start, then each reload's or adapter load's
``policy_version``, else one more than before): every answer carries it in the
``X-Atropos-Policy-Version`` header, ``/generate`` also as ``"policy_version"`` and
``/bridge/info`` as ``policy_version``. A request reports the version that was served when
it arrived (a request that waited through a reload is reported one version old).
- ``POST /v1/chat/completions``, ``POST /v1/completions``, ``GET /v1/models``: OpenAI's
  routes (`openai_routes`, beside this file), for environments' ``chat_completion`` and
  ``completion`` calls and the ``openai`` client, on the same engine and adapter. Atropos's
  bundled server lacks them.
- ``GET /metrics``: vLLM's Prometheus metrics (``vllm:generation_tokens_total``, queue and
  cache gauges, latencies), as ``vllm serve`` and ``atropos-vllm serve`` expose them.
- ``/bridge/*``: Atropos's shared-weights (CUDA IPC) routes (`bridge_routes`, beside this
  file). This server shares no weights; the routes report the engine's state and pause,
  resume, sleep or wake it where vLLM can, and answer ``{"status": "not_supported", ...}``
  where it cannot.

With ``--api-key`` every route except ``/health`` wants ``Authorization: Bearer KEY``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, AsyncIterator, Optional

import prometheus_client
import uvicorn
from fastapi import Depends, FastAPI, HTTPException, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel
from vllm.engine.arg_utils import AsyncEngineArgs
from vllm.exceptions import VLLMClientError
from vllm.lora.request import LoRARequest
from vllm.outputs import RequestOutput
from vllm.sampling_params import RequestOutputKind, SamplingParams
from vllm.usage.usage_lib import UsageContext
from vllm.utils import random_uuid
from vllm.utils.argparse_utils import FlexibleArgumentParser
from vllm.v1.engine.async_llm import AsyncLLM
from vllm.v1.metrics.prometheus import get_prometheus_registry

if __package__:
    from example_trainer.bridge_routes import BridgeHooks, bridge_router
    from example_trainer.openai_routes import CLIENT_CLOSED, EngineHooks, openai_router
else:  # run as a script: its own folder is on sys.path
    from bridge_routes import BridgeHooks, bridge_router
    from openai_routes import CLIENT_CLOSED, EngineHooks, openai_router

# atroposlib's vLLM plugins (the reload worker extension, the forked engine core), beside this package in a checkout and
# in an installed wheel; put on the path of this process and of the engine's worker processes
PLUGINS_DIR = Path(__file__).resolve().parent.parent / "atroposlib" / "local" / "vllm_plugins"
WORKER_EXTENSION = "atropos_worker.ReloadWorkerExtension"
OPEN_PATHS = ("/health",)
# atroposlib.policy_version's header (this file runs where atroposlib may not be installed)
POLICY_VERSION_HEADER = "X-Atropos-Policy-Version"


@dataclass
class ServerState:
    """What the routes remember between calls."""

    api_key: Optional[str] = None
    policy_version: int = 0
    reload_count: int = 0
    last_reload_time: float = 0.0
    adapter_path: Optional[str] = None
    adapter_name: Optional[str] = None
    adapter_id: int = 0
    adapter_loads: int = 0


state = ServerState()


def _authorised(request: Request) -> None:
    if state.api_key and request.url.path not in OPEN_PATHS:
        if request.headers.get("authorization") != f"Bearer {state.api_key}":
            raise HTTPException(status_code=401, detail="missing or wrong API key")


app = FastAPI(title="atroposlib trainer vLLM server", dependencies=[Depends(_authorised)])
engine: Optional[AsyncLLM] = None
_reload_lock = asyncio.Lock()


@app.middleware("http")
async def _policy_version_header(request: Request, call_next: Any) -> Response:
    arrived_at = state.policy_version  # what is served when the request arrives, not after a reload
    request.state.policy_version = arrived_at
    response = await call_next(request)
    response.headers[POLICY_VERSION_HEADER] = str(arrived_at)
    return response


def _engine() -> AsyncLLM:
    if engine is None:
        raise HTTPException(status_code=503, detail="the engine is not running yet")
    return engine


class LoraLoadRequest(BaseModel):
    adapter_path: str
    adapter_name: Optional[str] = None
    policy_version: Optional[int] = None


class LoraStatusResponse(BaseModel):
    lora_available: bool
    active_adapter_path: Optional[str]
    active_adapter_name: Optional[str]
    active_adapter_id: Optional[int]
    load_count: int
    available_adapters: list[str]


class ReloadRequest(BaseModel):
    weights_path: str
    policy_version: Optional[int] = None


class ReloadResponse(BaseModel):
    status: str
    seconds: float


@app.get("/health")
async def health() -> Response:
    return Response(status_code=200)


@app.get("/health_generate")
async def health_generate() -> Response:
    running = _engine()
    try:
        async for _ in running.generate({"prompt_token_ids": [0]}, SamplingParams(max_tokens=1), random_uuid()):
            pass
    except Exception as exc:  # any engine failure means "unhealthy", reported with its reason
        raise HTTPException(status_code=500, detail=str(exc)) from exc
    return Response(status_code=200)


def _prompt(value: Any) -> str | dict[str, list[int]]:
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("prompt_token_ids"), list):
        ids = value["prompt_token_ids"]
        if all(isinstance(token, int) and not isinstance(token, bool) for token in ids):
            return {"prompt_token_ids": ids}
    raise HTTPException(status_code=400, detail='"prompt" must be a string or {"prompt_token_ids": [int, ...]}')


def _sampling_params(fields: dict[str, Any], stream: bool) -> SamplingParams:
    # streams send the text so far at each step; other requests only the final answer
    kind = RequestOutputKind.CUMULATIVE if stream else RequestOutputKind.FINAL_ONLY
    try:
        return SamplingParams(**fields, output_kind=kind)
    except (TypeError, ValueError, VLLMClientError) as exc:
        raise HTTPException(status_code=400, detail=f"bad sampling parameters: {exc}") from exc


def _adapter() -> Optional[LoRARequest]:
    if state.adapter_path is None:
        return None
    return LoRARequest(lora_name=state.adapter_name or "adapter", lora_int_id=state.adapter_id,
                       lora_path=state.adapter_path)


def _positions(logprobs: Any) -> list[Optional[dict[str, float]]]:
    """vLLM's per-position ``{token id: Logprob}`` (list or FlatLogprobs) as JSON objects."""
    return [None if position is None else {str(token): value.logprob for token, value in position.items()}
            for position in logprobs]


def _answer(output: RequestOutput, params: SamplingParams, policy_version: int) -> dict[str, Any]:
    prompt = output.prompt
    if prompt is None:
        tokenizer = _engine().tokenizer
        prompt = tokenizer.decode(output.prompt_token_ids) if tokenizer is not None else ""
    answer: dict[str, Any] = {
        "text": [choice.text for choice in output.outputs], "prompt": prompt,
        "finish_reasons": [choice.finish_reason for choice in output.outputs],
        "prompt_token_ids": list(output.prompt_token_ids or []),
        "token_ids": [list(choice.token_ids) for choice in output.outputs],
        "policy_version": policy_version,
    }
    if params.logprobs is not None:
        answer["logprobs"] = [[[position] for position in _positions(choice.logprobs or [])]
                              for choice in output.outputs]
    if params.prompt_logprobs is not None:
        answer["prompt_logprobs"] = _positions(getattr(output, "prompt_logprobs", None) or [])
    return answer


async def _final_output(outputs: AsyncIterator[RequestOutput]) -> RequestOutput:
    final = None
    async for output in outputs:
        final = output
    if final is None:
        raise HTTPException(status_code=500, detail="the engine returned no output")
    return final


async def _disconnected(request: Request) -> None:
    """Returns when the client hangs up (the body has been read, so only that message is left)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def _unless_disconnected(request: Request, outputs: AsyncIterator[RequestOutput]) -> Optional[RequestOutput]:
    """The final output, or None when the client hung up first (the generation is then cancelled,
    which aborts the request in the engine)."""
    work = asyncio.ensure_future(_final_output(outputs))
    watch = asyncio.ensure_future(_disconnected(request))
    done, _ = await asyncio.wait({work, watch}, return_when=asyncio.FIRST_COMPLETED)
    if work not in done:
        work.cancel()
        return None
    watch.cancel()
    return work.result()


async def _final_or_hung_up(request: Request, outputs: AsyncIterator[RequestOutput]) -> Optional[RequestOutput]:
    """`_unless_disconnected`, with the engine's complaints about the request itself as 400."""
    try:
        return await _unless_disconnected(request, outputs)
    except (ValueError, VLLMClientError) as exc:  # the request's fault: prompt too long, bad token ids, ...
        raise HTTPException(status_code=400, detail=str(exc)) from exc


@app.post("/generate")
async def generate(request: Request) -> Response:
    body = await request.json()
    if not isinstance(body, dict) or "prompt" not in body:
        raise HTTPException(status_code=400, detail='the body must be a JSON object with a "prompt"')
    prompt = _prompt(body.pop("prompt"))
    stream = bool(body.pop("stream", False))
    params = _sampling_params(body, stream)
    outputs = _engine().generate(prompt, params, random_uuid(), lora_request=_adapter())
    if stream:
        return StreamingResponse(_stream(outputs), media_type="application/x-ndjson")
    output = await _final_or_hung_up(request, outputs)
    if output is None:
        return Response(status_code=CLIENT_CLOSED)
    return JSONResponse(_answer(output, params, request.state.policy_version))


async def _stream(outputs: AsyncIterator[RequestOutput]) -> AsyncIterator[bytes]:
    async for output in outputs:
        yield (json.dumps({"text": [(output.prompt or "") + choice.text for choice in output.outputs]}) + "\n").encode()


app.include_router(openai_router(EngineHooks(engine=_engine, adapter=_adapter, final_output=_final_or_hung_up)))


@app.post("/reload_weights")
async def reload_weights(request: ReloadRequest) -> ReloadResponse:
    running = _engine()
    if not Path(request.weights_path).is_dir():
        raise HTTPException(status_code=404, detail=f"no weights folder at {request.weights_path}")
    started = time.monotonic()
    async with _reload_lock:
        # a server its caller froze (`/bridge/pause?mode=keep`) stays frozen and is reloaded as it is;
        # otherwise "wait": requests in flight finish on the weights they started with, new ones queue
        frozen = await running.is_paused()
        if not frozen:
            await running.pause_generation(mode="wait", clear_cache=False)
        try:
            # `atropos_worker`: a tied LM head gets the new embedding, which vLLM's own reload leaves out
            await running.collective_rpc("reload_weights_keeping_ties", kwargs={"weights_path": request.weights_path})
            # cached prefixes were computed with the old weights; a frozen request gives its cache back too
            # and recomputes it on the new weights when it goes on
            await running.reset_prefix_cache(reset_running_requests=frozen)
            # before generation resumes: no request can arrive on the new weights and see the old version
            state.reload_count += 1
            state.policy_version = state.policy_version + 1 if request.policy_version is None \
                else request.policy_version
            state.last_reload_time = time.time()
        except Exception as exc:
            raise HTTPException(status_code=500, detail=f"reload failed: {exc}") from exc
        finally:
            if not frozen:
                await running.resume_generation()
    return ReloadResponse(status="ok", seconds=time.monotonic() - started)


def _lora_enabled() -> bool:
    return engine is not None and engine.vllm_config.lora_config is not None


def _adapters_in(folder: Path) -> list[str]:
    if not folder.is_dir():
        return []
    return sorted(item.name for item in folder.iterdir() if (item / "adapter_config.json").exists())


@app.get("/lora/status")
async def lora_status() -> LoraStatusResponse:
    return LoraStatusResponse(
        lora_available=_lora_enabled(), active_adapter_path=state.adapter_path,
        active_adapter_name=state.adapter_name, active_adapter_id=state.adapter_id if state.adapter_path else None,
        load_count=state.adapter_loads, available_adapters=_adapters_in(Path(os.environ.get("LOGDIR", "."))))


@app.post("/lora/load")
async def lora_load(request: LoraLoadRequest) -> dict[str, Any]:
    if not Path(request.adapter_path).exists():
        raise HTTPException(status_code=404, detail=f"no adapter at {request.adapter_path}")
    if not _lora_enabled():
        raise HTTPException(status_code=400, detail="LoRA is off: start the server with --enable-lora")
    previous = state.adapter_id if state.adapter_path else None
    # a new id for every load: vLLM caches adapters by id, so a reused id would keep old weights
    adapter = LoRARequest(lora_name=request.adapter_name or f"adapter_{state.adapter_loads}",
                          lora_int_id=state.adapter_loads + 1, lora_path=request.adapter_path)
    try:
        await _engine().add_lora(adapter)  # load now, so a broken adapter fails here, not in /generate
    except Exception as exc:
        raise HTTPException(status_code=400, detail=f"could not load the adapter: {exc}") from exc
    state.adapter_path, state.adapter_name, state.adapter_id = adapter.lora_path, adapter.lora_name, adapter.lora_int_id
    state.adapter_loads += 1
    state.policy_version = state.policy_version + 1 if request.policy_version is None else request.policy_version
    if previous is not None:
        await _engine().remove_lora(previous)
    return {"status": "ok", "adapter_path": state.adapter_path, "adapter_name": state.adapter_name,
            "adapter_id": state.adapter_id, "load_count": state.adapter_loads,
            "adapter_config": _adapter_summary(Path(request.adapter_path))}


def _adapter_summary(folder: Path) -> dict[str, Any]:
    try:
        config = json.loads((folder / "adapter_config.json").read_text())
    except (OSError, ValueError):
        return {}
    return {"r": config.get("r"), "lora_alpha": config.get("lora_alpha"),
            "target_modules": config.get("target_modules"), "base_model": config.get("base_model_name_or_path")}


@app.post("/lora/unload")
async def lora_unload() -> dict[str, Any]:
    previous_path, previous_name = state.adapter_path, state.adapter_name
    state.adapter_path, state.adapter_name, state.adapter_id = None, None, 0
    return {"status": "ok", "previous_adapter": previous_path, "previous_name": previous_name}


@app.get("/metrics")
async def metrics() -> Response:
    """The engine's Prometheus metrics, in the text exposition format."""
    return Response(prometheus_client.generate_latest(get_prometheus_registry()),
                    media_type=prometheus_client.CONTENT_TYPE_LATEST)


def _updates() -> dict[str, Any]:
    return {"update_count": state.reload_count, "policy_version": state.policy_version,
            "last_update_time": state.last_reload_time}


app.include_router(bridge_router(BridgeHooks(engine=_engine, engine_running=lambda: engine is not None,
                                             updates=_updates)))


def build_parser() -> argparse.ArgumentParser:
    parser = FlexibleArgumentParser(description="vLLM server for the GRPO example trainer.")
    parser.add_argument("--host", default="127.0.0.1", help="Address to listen on (0.0.0.0: every interface).")
    parser.add_argument("--port", type=int, default=9001, help="Port to listen on.")
    parser.add_argument("--api-key", default=None, help="Require 'Authorization: Bearer KEY' (all but /health).")
    parser.add_argument("--ssl-keyfile", default=None, help="TLS private key file.")
    parser.add_argument("--ssl-certfile", default=None, help="TLS certificate file.")
    parser.add_argument("--ssl-ca-certs", default=None, help="CA certificates for client certificates.")
    parser.add_argument("--root-path", default="", help="URL prefix when behind a path-based proxy.")
    parser.add_argument("--policy-version", type=int, default=0,
                        help="Policy version of the weights served at start (the trainer step they are from).")
    parser = AsyncEngineArgs.add_cli_args(parser)
    # the trainer's importance ratio needs the log-probabilities of the distribution sampled from
    parser.set_defaults(logprobs_mode="processed_logprobs", worker_extension_cls=WORKER_EXTENSION)
    return parser


def _exit_on_sigterm(signum: int, frame: Any) -> None:
    raise SystemExit(128 + signum)


async def serve(args: argparse.Namespace) -> None:
    """Load the engine, then answer HTTP until SIGINT or SIGTERM; the engine is shut down either way."""
    global engine
    state.api_key = args.api_key
    state.policy_version = args.policy_version
    sys.path.insert(0, str(PLUGINS_DIR))
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, (str(PLUGINS_DIR), os.environ.get("PYTHONPATH"))))
    # vLLM loaded its plugins when the parser was built, before this folder was on the path
    from atropos_engine_fork import fork_the_engine_core

    fork_the_engine_core()
    # uvicorn re-raises the SIGTERM it caught once it has stopped: with the default handler the
    # process would die right there, skipping `engine.shutdown()` and leaving the engine's
    # processes running when only the server's own pid was signalled (`kill PID`)
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    engine = AsyncLLM.from_engine_args(AsyncEngineArgs.from_cli_args(args), usage_context=UsageContext.API_SERVER)
    try:
        # vLLM's own --log-level (absent unless given) sets uvicorn's too
        log_level = str(getattr(args, "log_level", "info")).lower()
        config = uvicorn.Config(app, host=args.host, port=args.port, log_level=log_level,
                                root_path=args.root_path, ssl_keyfile=args.ssl_keyfile,
                                ssl_certfile=args.ssl_certfile, ssl_ca_certs=args.ssl_ca_certs)
        await uvicorn.Server(config).serve()
    finally:
        # shut down now rather than in AsyncLLM.__del__ at interpreter exit, when vLLM's modules are gone
        running, engine = engine, None
        running.shutdown()


if __name__ == "__main__":
    asyncio.run(serve(build_parser().parse_args()))
