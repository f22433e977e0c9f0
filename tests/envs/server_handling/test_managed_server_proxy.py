"""The ManagedServer proxy: sessions over a token-level backend, its client, TTL and auth."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Iterator

import httpx
import pytest
import transformers
from fastapi.testclient import TestClient

from atroposlib.envs.server_handling.configs import APIServerConfig
from atroposlib.envs.server_handling.managed_server_proxy import create_app
from atroposlib.envs.server_handling.proxy_client import ProxyManagedServer, create_proxy_session
from atroposlib.envs.server_handling.server_manager import ServerManager
from tests.envs.conftest import ROOT
from tests.fake_openai import COMPLETION_IDS
from tests.helpers import free_port

USER = [{"role": "user", "content": "What is 2 + 2?"}]


def _backend(url: str, server_type: str = "vllm", tokenizer: str = "none") -> APIServerConfig:
    return APIServerConfig(base_url=url, model_name="fake-model", server_type=server_type, health_check=False,
                           timeout=5, tokenizer_name=tokenizer)


@pytest.fixture(scope="module")
def proxy_url(inference_url: str, tokenizer_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    config = tmp_path_factory.mktemp("proxy") / "servers.json"
    config.write_text(json.dumps({"model_name": "fake-model", "tokenizer_name": str(tokenizer_dir),
                                  "servers": [_backend(inference_url).model_dump()]}))
    port = free_port()
    process = subprocess.Popen([sys.executable, "-m", "atroposlib.envs.server_handling.managed_server_proxy",
                                "--config", str(config), "--port", str(port)], cwd=ROOT)
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(200):
            try:
                if httpx.get(url + "/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.1)
        yield url
    finally:
        process.terminate()
        process.wait(10)


def test_a_session_records_tokens_and_masks_through_the_proxy(proxy_url: str, tokenizer_dir: Path) -> None:
    tokenizer = transformers.AutoTokenizer.from_pretrained(tokenizer_dir)

    async def scenario() -> tuple[Any, dict[str, Any], dict[str, Any]]:
        session = await create_proxy_session(proxy_url, model_name="fake-model")
        assert session.get_url() == f"{proxy_url}/{session.session_uuid}/v1"
        async with session:
            response = await session.chat_completion(messages=USER, n=2, max_tokens=8, seed=3)
            inside = session.get_state()  # fresh inside the block, no fetch_state() needed
        gone = httpx.get(f"{proxy_url}/{session.session_uuid}/nodes")
        return response, inside, {"status": gone.status_code, "body": gone.json()}

    response, state, after = asyncio.run(scenario())
    assert response.id.startswith("chatcmpl-") and len(response.choices) == 2
    assert response.choices[0].message.content == tokenizer.decode(COMPLETION_IDS, skip_special_tokens=True)
    nodes = state["nodes"]
    assert len(nodes) == 2
    prompt_ids = nodes[0].tokens[: -len(COMPLETION_IDS)]
    assert nodes[0].tokens[-len(COMPLETION_IDS):] == COMPLETION_IDS
    assert nodes[0].masked_tokens == [-100] * len(prompt_ids) + COMPLETION_IDS
    assert nodes[0].logprobs[: len(prompt_ids)] == [1.0] * len(prompt_ids)
    assert after["status"] == 404 and after["body"]["error"]["type"] == "not_found_error"


def test_proxy_admin_endpoints_and_errors(proxy_url: str, inference_url: str) -> None:
    health = httpx.get(f"{proxy_url}/health").json()
    assert health["status"] == "ok" and health["servers"] == 1 and health["model"] == "fake-model"
    assert httpx.get(f"{proxy_url}/v1/models").json()["data"][0]["owned_by"] == "atropos"
    assert httpx.get(f"{proxy_url}/servers").json()["servers"][0]["server_type"] == "vllm"
    pinned = httpx.post(f"{proxy_url}/sessions/create", json={"base_url": inference_url + "/"}).json()
    assert pinned["base_url"] == inference_url
    unknown = httpx.post(f"{proxy_url}/sessions/create", json={"base_url": "http://nowhere/v1"})
    assert unknown.status_code == 404 and unknown.json()["error"]["message"].startswith("no backend server")
    sid = pinned["uuid"]
    assert any(s["uuid"] == sid for s in httpx.get(f"{proxy_url}/sessions").json()["sessions"])
    empty = httpx.post(f"{proxy_url}/{sid}/v1/chat/completions", json={"messages": []})
    assert empty.status_code == 400 and empty.json()["error"]["type"] == "invalid_request_error"
    bad = httpx.post(f"{proxy_url}/{sid}/v1/chat/completions", json={"messages": "hi", "n": 0})
    assert bad.status_code == 400
    rendered = httpx.post(f"{proxy_url}/{sid}/v1/chat/completions/render", json={"messages": USER}).json()
    assert rendered["num_tokens"] == len(rendered["token_ids"]) > 0 and "2 + 2" in rendered["prompt_text"]
    assert httpx.delete(f"{proxy_url}/{sid}").json() == {"status": "deleted", "uuid": sid}
    assert httpx.delete(f"{proxy_url}/{sid}").status_code == 404


def test_server_manager_uses_the_proxy_when_configured(proxy_url: str, inference_url: str) -> None:
    manager = ServerManager(configs=[_backend(inference_url, "openai")], proxy_url=proxy_url)

    async def scenario() -> tuple[int, int]:
        async with manager.managed_server() as managed:
            assert isinstance(managed, ProxyManagedServer)
            await managed.chat_completion(messages=USER, n=3)
            return len(managed.get_state()["nodes"]), len(httpx.get(f"{proxy_url}/sessions").json()["sessions"])

    nodes, open_sessions = asyncio.run(scenario())
    assert nodes == 3 and open_sessions >= 1
    assert all(s["num_nodes"] != 3 for s in httpx.get(f"{proxy_url}/sessions").json()["sessions"])


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_idle_sessions_expire_and_the_api_key_is_enforced(tokenizer_dir: Path) -> None:
    tokenizer = transformers.AutoTokenizer.from_pretrained(tokenizer_dir)
    clock = _Clock()
    manager = ServerManager(configs=[_backend("http://127.0.0.1:9/v1", "openai")])
    app = create_app(manager, tokenizer, "m", session_ttl=60, api_key="secret", clock=clock)
    with TestClient(app) as client:
        assert client.get("/health").status_code == 401
        auth = {"Authorization": "Bearer secret"}
        sid = client.post("/sessions/create", json={}, headers=auth).json()["uuid"]
        clock.now += 59
        assert client.get(f"/{sid}/nodes", headers=auth).status_code == 200  # touching it keeps it alive
        clock.now += 61
        assert client.get(f"/{sid}/nodes", headers=auth).status_code == 404
        assert client.get("/health", headers=auth).json()["sessions"] == 0


def test_backend_failure_is_a_server_error_not_a_crash(tokenizer_dir: Path) -> None:
    tokenizer = transformers.AutoTokenizer.from_pretrained(tokenizer_dir)
    dead = APIServerConfig(base_url=f"http://127.0.0.1:{free_port()}/v1", model_name="m", server_type="vllm",
                           health_check=False, timeout=1, tokenizer_name=str(tokenizer_dir))
    app = create_app(ServerManager(configs=[dead]), tokenizer, "m")
    with TestClient(app) as client:
        sid = client.post("/sessions/create", json={}).json()["uuid"]
        answer = client.post(f"/{sid}/v1/chat/completions", json={"messages": USER})
        assert answer.status_code == 500 and answer.json()["error"]["type"] == "server_error"


def test_tool_calls_come_back_through_the_proxy(tokenizer_dir: Path) -> None:
    from openai.types.chat import ChatCompletion

    from tests.envs.server_handling.test_managed_server import TokenHarness
    from tests.envs.server_handling.test_tool_calls import RAW, TOOLS

    tokenizer = transformers.AutoTokenizer.from_pretrained(tokenizer_dir)
    manager = ServerManager(configs=[], testing=True)
    harness = TokenHarness(tokenizer.encode(RAW, add_special_tokens=False))
    harness.config = APIServerConfig(base_url="http://harness/v1", model_name="m")
    manager.servers = [harness]
    with TestClient(create_app(manager, tokenizer, "m")) as client:
        sid = client.post("/sessions/create", json={"tool_parser": "hermes"}).json()["uuid"]
        answer = client.post(f"/{sid}/v1/chat/completions", json={"messages": USER, "tools": TOOLS})
        assert answer.status_code == 200, answer.text
        completion = ChatCompletion.model_validate(answer.json())
        assert completion.choices[0].finish_reason == "tool_calls"
        assert completion.choices[0].message.tool_calls[0].function.name == "add"
        assert len(client.get(f"/{sid}/nodes").json()["nodes"]) == 1


def test_backends_with_partial_configs_get_sessions(tokenizer_dir: Path) -> None:
    """Stand-in backends (test harnesses) may have a config with a model name only."""
    from types import SimpleNamespace

    from atroposlib.envs.server_handling.server_harness import ServerHarness

    harness = ServerHarness()
    harness.config = SimpleNamespace(model_name="m")
    manager = ServerManager(configs=[], testing=True)
    manager.servers = [harness]
    tokenizer = transformers.AutoTokenizer.from_pretrained(tokenizer_dir)
    with TestClient(create_app(manager, tokenizer, "m")) as client:
        created = client.post("/sessions/create", json={})
        assert created.status_code == 200 and created.json()["base_url"] is None
        assert client.get("/sessions").json()["sessions"][0]["base_url"] is None
        assert client.get("/servers").json() == {"servers": [
            {"index": 0, "base_url": None, "healthy": True, "model_name": "m", "server_type": None}]}
