"""The ManagedServer proxy: token tracking for code that only speaks the OpenAI API.

Agent frameworks (smolagents, SWE-style harnesses, subprocesses) cannot call a
`ManagedServer` in-process. The proxy gives each rollout a *session*, an OpenAI base URL
(``{proxy}/{uuid}/v1``) backed by its own `ManagedServer`, so the framework makes ordinary
chat requests while the proxy records tokens, masks and logprobs; the environment reads
them back from ``GET /{uuid}/nodes`` (or with `ProxyManagedServer`).

Run it with ``python -m atroposlib.envs.server_handling.managed_server_proxy --config
servers.json [--port 9100] [--host 127.0.0.1] [--session-ttl 3600] [--api-key KEY]``.
Idle sessions expire after ``--session-ttl`` seconds; requests on one session run one at a
time (a session is one conversation).
"""

from __future__ import annotations

import argparse
import asyncio
import hmac
import json
import logging
import os
import time
import uuid as uuidlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from atroposlib.envs.server_handling.managed_server import DummyManagedServer, ManagedServer
from atroposlib.envs.server_handling.openai_server import OpenAIServer
from atroposlib.envs.server_handling.proxy_wire import (
    ProxyBackends,
    ProxyChatRequest,
    ProxyErrorBody,
    RenderedPrompt,
    SessionCreate,
    SessionInfo,
    SessionSummary,
)
from atroposlib.envs.server_handling.server_manager import ServerManager, server_setting

log = logging.getLogger("atroposlib.proxy")

DEFAULT_SESSION_TTL = 3600.0


class ProxyError(Exception):
    def __init__(self, status: int, message: str, kind: str = "invalid_request_error") -> None:
        super().__init__(message)
        self.status, self.message, self.kind = status, message, kind


def _error(status: int, message: str, kind: str = "invalid_request_error") -> JSONResponse:
    body = ProxyErrorBody(message=message, type=kind, code=status)  # type: ignore[arg-type]
    return JSONResponse({"error": body.model_dump()}, status_code=status)


@dataclass
class Session:
    """One conversation's managed server and bookkeeping."""

    uuid: str
    managed: Any
    base_url: Optional[str]
    tool_parser: Optional[str]
    created_at: float
    last_accessed: float
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    def nodes(self) -> list[Any]:
        state = self.managed.get_state()
        return list(state["sequences"].values()) if "sequences" in state else list(state["nodes"])


class SessionStore:
    """Sessions by uuid, with idle expiry measured on `clock`."""

    def __init__(self, ttl: float, clock: Callable[[], float]) -> None:
        self.ttl, self.clock = ttl, clock
        self.sessions: dict[str, Session] = {}

    def expire_idle(self) -> None:
        now = self.clock()
        for key in [k for k, s in self.sessions.items() if now - s.last_accessed > self.ttl and not s.lock.locked()]:
            self.remove(key)

    def get(self, key: str) -> Session:
        self.expire_idle()
        session = self.sessions.get(key)
        if session is None:
            raise ProxyError(404, f"no session {key} (it may have expired)", "not_found_error")
        session.last_accessed = self.clock()
        return session

    def remove(self, key: str) -> None:
        session = self.sessions.pop(key, None)
        if session is not None:
            session.managed.reset()


class ProxyState:
    """What the proxy serves: backends, tokenizer, sessions."""

    def __init__(self, server_manager: ServerManager, tokenizer: Any, model_name: str, ttl: float,
                 clock: Callable[[], float]) -> None:
        self.server_manager, self.tokenizer, self.model_name = server_manager, tokenizer, model_name
        self.store = SessionStore(ttl, clock)
        self.clock = clock

    def backend_for(self, base_url: Optional[str]) -> Any:
        if base_url is None:
            return self.server_manager.pick_server(training=True)
        try:
            return self.server_manager.server_at(base_url)
        except ValueError:
            raise ProxyError(404, f"no backend server at {base_url}", "not_found_error") from None

    def open_session(self, request: SessionCreate) -> Session:
        server = self.backend_for(request.base_url)
        if type(server) is OpenAIServer:  # no token ids from plain OpenAI routes
            managed: Any = DummyManagedServer(server, self.tokenizer, track_tree=request.track_tree)
        else:
            managed = ManagedServer(server, self.tokenizer, track_tree=request.track_tree,
                                    tool_parser=request.tool_parser)
        now = self.clock()
        session = Session(str(uuidlib.uuid4()), managed, server_setting(server, "base_url") or None, request.tool_parser,
                          now, now)
        self.store.expire_idle()
        self.store.sessions[session.uuid] = session
        return session


def _require_key(api_key: Optional[str]) -> Callable[[Request], None]:
    def check(request: Request) -> None:
        supplied = request.headers.get("authorization", "").encode()
        if api_key and not hmac.compare_digest(supplied, f"Bearer {api_key}".encode()):
            raise ProxyError(401, "missing or wrong bearer token", "authentication_error")
    return check


def _render(session: Session, tokenizer: Any, body: ProxyChatRequest) -> RenderedPrompt:
    messages = [m.model_dump(exclude_none=True) for m in body.messages]
    if isinstance(session.managed, ManagedServer):
        text = session.managed.render(messages, body.tools)
    else:
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True, tools=body.tools)
    ids = list(tokenizer.encode(text, add_special_tokens=False))
    return RenderedPrompt(prompt_text=text, token_ids=ids, num_tokens=len(ids))


def _install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(ProxyError)
    async def proxy_error(request: Request, exc: ProxyError) -> JSONResponse:
        return _error(exc.status, exc.message, exc.kind)

    @app.exception_handler(RequestValidationError)
    async def invalid_body(request: Request, exc: RequestValidationError) -> JSONResponse:
        problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
        return _error(400, f"invalid request: {problems}")

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        return _error(exc.status_code, str(exc.detail), "not_found_error" if exc.status_code == 404 else "invalid_request_error")


def create_app(server_manager: ServerManager, tokenizer: Any, model_name: str = "unknown",
               session_ttl: float = DEFAULT_SESSION_TTL, api_key: Optional[str] = None,
               clock: Callable[[], float] = time.time) -> FastAPI:
    """The proxy's ASGI app over `server_manager`'s backends."""
    state = ProxyState(server_manager, tokenizer, model_name, session_ttl, clock)
    app = FastAPI(title="atroposlib ManagedServer proxy", dependencies=[Depends(_require_key(api_key))])
    app.state.proxy = state
    _install_error_handlers(app)
    _add_admin_routes(app, state)
    _add_session_routes(app, state)
    return app


def _add_admin_routes(app: FastAPI, state: ProxyState) -> None:
    @app.get("/health")
    async def health() -> dict[str, Any]:
        servers = state.server_manager.servers
        return {"status": "ok", "model": state.model_name, "sessions": len(state.store.sessions),
                "servers": len(servers), "healthy_servers": sum(bool(s.server_healthy) for s in servers)}

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [{"id": state.model_name, "object": "model",
                                            "created": int(state.clock()), "owned_by": "atropos"}]}

    @app.post("/setup")
    async def setup(backends: ProxyBackends) -> dict[str, Any]:
        old = state.server_manager
        state.server_manager = ServerManager(configs=backends.server_configs())
        state.model_name = backends.model_name
        await old.close()
        return {"status": "ok", "servers": len(backends.servers), "model_name": state.model_name}

    @app.get("/servers")
    async def servers() -> dict[str, Any]:
        return {"servers": [{"index": i, "base_url": server_setting(s, "base_url"), "healthy": bool(s.server_healthy),
                             "model_name": server_setting(s, "model_name"), "server_type": server_setting(s, "server_type")}
                            for i, s in enumerate(state.server_manager.servers)]}


def _add_session_routes(app: FastAPI, state: ProxyState) -> None:
    @app.post("/sessions/create")
    async def create_session(request: SessionCreate) -> SessionInfo:
        session = state.open_session(request)
        return SessionInfo(uuid=session.uuid, model_name=state.model_name, tool_parser=session.tool_parser,
                           base_url=session.base_url, created_at=session.created_at)

    @app.get("/sessions")
    async def list_sessions() -> dict[str, Any]:
        state.store.expire_idle()
        return {"sessions": [SessionSummary(uuid=s.uuid, model_name=state.model_name, base_url=s.base_url,
                                            created_at=s.created_at, last_accessed=s.last_accessed,
                                            num_nodes=len(s.nodes())).model_dump()
                             for s in state.store.sessions.values()]}

    @app.post("/{session_id}/v1/chat/completions")
    async def chat(session_id: str, body: ProxyChatRequest) -> JSONResponse:
        session = state.store.get(session_id)
        if not body.messages:
            raise ProxyError(400, "messages must not be empty")
        messages = [m.model_dump(exclude_none=True) for m in body.messages]
        async with session.lock:
            try:
                response = await session.managed.chat_completion(messages=messages, **body.sampling_kwargs())
            except Exception as exc:  # the backend failed; the caller's request was fine
                log.exception("session %s: backend call failed", session_id)
                raise ProxyError(500, f"inference backend failed: {exc}", "server_error") from exc
        payload = response.model_dump(exclude_none=True, warnings=False)  # tool_calls are plain dicts
        payload.update(id=f"chatcmpl-{uuidlib.uuid4().hex[:12]}", model=state.model_name)
        return JSONResponse(payload)

    @app.post("/{session_id}/v1/chat/completions/render")
    async def render(session_id: str, body: ProxyChatRequest) -> RenderedPrompt:
        session = state.store.get(session_id)
        try:
            return _render(session, state.tokenizer, body)
        except Exception as exc:  # a template that cannot render these messages is the caller's problem
            raise ProxyError(400, f"cannot render these messages: {exc}") from exc

    @app.get("/{session_id}/nodes")
    async def nodes(session_id: str) -> dict[str, Any]:
        return {"nodes": [node.model_dump() for node in state.store.get(session_id).nodes()]}

    @app.delete("/{session_id}")
    async def delete(session_id: str) -> dict[str, str]:
        state.store.get(session_id)
        state.store.remove(session_id)
        return {"status": "deleted", "uuid": session_id}


def load_backends(path: Path) -> ProxyBackends:
    try:
        return ProxyBackends.model_validate(json.loads(path.read_text()))
    except (OSError, ValueError, ValidationError) as exc:
        raise SystemExit(f"error: cannot use --config {path}: {exc}") from None


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="managed_server_proxy", description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", type=Path, required=True, help="JSON file: model_name, tokenizer_name, servers.")
    parser.add_argument("--port", type=int, default=9100, help="Port to listen on.")
    parser.add_argument("--host", default="127.0.0.1", help="Address to listen on (127.0.0.1: this machine only).")
    parser.add_argument("--session-ttl", type=float, default=DEFAULT_SESSION_TTL, help="Idle seconds before a session expires.")
    parser.add_argument("--api-key", default=os.environ.get("ATROPOS_PROXY_API_KEY"),
                        help="Require this bearer token (default: $ATROPOS_PROXY_API_KEY).")
    return parser


def main(argv: Optional[list[str]] = None) -> None:
    args = build_parser().parse_args(argv)
    backends = load_backends(args.config)
    from transformers import AutoTokenizer
    import uvicorn

    tokenizer = AutoTokenizer.from_pretrained(backends.tokenizer_name or backends.model_name)
    app = create_app(ServerManager(configs=backends.server_configs()), tokenizer, backends.model_name,
                     args.session_ttl, args.api_key)
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
