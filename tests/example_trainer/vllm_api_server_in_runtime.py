"""Checks of the bundled vLLM server's routes against a fake engine. They import vLLM, so they
run inside the vLLM runtime: test_vllm_api_server.py copies this file into a temporary test
package and runs it with the runtime's python (the name keeps the library's pytest away)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any, AsyncIterator, Iterator

import pytest
from fastapi.testclient import TestClient
from vllm.logprobs import Logprob

from example_trainer import vllm_api_server as server


class FakeTokenizer:
    """Token ids are character codes; the chat template writes ``role: content`` lines."""

    def decode(self, ids: list[int]) -> str:
        return " ".join(map(str, ids))

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return [ord(char) for char in text]

    def apply_chat_template(self, messages: list[dict[str, Any]], add_generation_prompt: bool, tokenize: bool) -> str:
        if messages[0]["role"] != "user":
            raise ValueError("Conversation roles must start with user")
        return "".join(f"{message['role']}: {message['content']}\n" for message in messages) + "assistant: "


class FakeEngine:
    """Records what the routes ask of the engine; generates one fixed completion."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []
        self.fail_reload = False
        self.paused = False
        self.vllm_config = SimpleNamespace(lora_config=None)
        self.model_config = SimpleNamespace(model="tiny", dtype="float32", enable_sleep_mode=False, max_model_len=64)
        self.tokenizer = FakeTokenizer()

    def generate(self, prompt: Any, params: Any, request_id: str, lora_request: Any = None) -> AsyncIterator[Any]:
        self.calls.append(("generate", (prompt, params, lora_request)))

        async def outputs() -> AsyncIterator[Any]:
            choice = SimpleNamespace(text=" x", finish_reason="length", token_ids=[5],
                                     logprobs=[{5: Logprob(-0.5), 6: Logprob(-1.5)}])
            yield SimpleNamespace(prompt=None, prompt_token_ids=[1, 2], outputs=[choice],
                                  prompt_logprobs=[None, {2: Logprob(-2.0)}])

        return outputs()

    async def pause_generation(self, **kwargs: Any) -> None:
        self.calls.append(("pause", kwargs))
        self.paused = True

    async def is_paused(self) -> bool:
        return self.paused

    async def collective_rpc(self, method: str, kwargs: Any = None) -> None:
        self.calls.append((method, kwargs))
        if self.fail_reload:
            raise RuntimeError("shapes differ")

    async def reset_prefix_cache(self, reset_running_requests: bool = False) -> bool:
        self.calls.append(("reset_prefix_cache", {"reset_running_requests": reset_running_requests}))
        return True

    async def resume_generation(self) -> None:
        self.calls.append(("resume", None))
        self.paused = False

    async def add_lora(self, request: Any) -> bool:
        self.calls.append(("add_lora", request.lora_int_id))
        return True

    async def remove_lora(self, lora_id: int) -> bool:
        self.calls.append(("remove_lora", lora_id))
        return True


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeEngine]:
    engine = FakeEngine()
    monkeypatch.setattr(server, "engine", engine)
    monkeypatch.setattr(server, "state", server.ServerState())
    yield engine


def test_token_prompts_return_ids_logprobs_and_prompt_logprobs(fake: FakeEngine) -> None:
    answer = TestClient(server.app).post("/generate", json={
        "prompt": {"prompt_token_ids": [1, 2]}, "max_tokens": 1, "logprobs": 1, "prompt_logprobs": 1})
    assert answer.status_code == 200, answer.text
    assert answer.json()["policy_version"] == 0 and answer.headers["X-Atropos-Policy-Version"] == "0"
    prompt, params, _ = fake.calls[0][1]
    assert prompt == {"prompt_token_ids": [1, 2]} and params.max_tokens == 1
    assert answer.json() == {"text": [" x"], "prompt": "1 2", "finish_reasons": ["length"], "prompt_token_ids": [1, 2],
                             "token_ids": [[5]], "logprobs": [[[{"5": -0.5, "6": -1.5}]]],
                             "prompt_logprobs": [None, {"2": -2.0}], "policy_version": 0}


@pytest.mark.parametrize("body, detail", [
    ({"max_tokens": 1}, '"prompt"'),
    ({"prompt": {"prompt_token_ids": ["a"]}}, "prompt_token_ids"),
    ({"prompt": "hi", "no_such_parameter": 1}, "bad sampling parameters"),
    ({"prompt": "hi", "n": 2, "temperature": 0.0}, "greedy"),
])
def test_bad_requests_are_400_with_the_reason(fake: FakeEngine, body: dict[str, Any], detail: str) -> None:
    answer = TestClient(server.app).post("/generate", json=body)
    assert answer.status_code == 400 and detail in answer.json()["detail"]


def test_without_an_engine_generation_is_503(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(server, "engine", None)
    client = TestClient(server.app)
    assert client.get("/health").status_code == 200
    assert client.post("/generate", json={"prompt": "hi"}).status_code == 503


def test_reload_pauses_reloads_resets_and_resumes(fake: FakeEngine, tmp_path: Path) -> None:
    answer = TestClient(server.app).post("/reload_weights", json={"weights_path": str(tmp_path)})
    assert answer.status_code == 200 and answer.json()["status"] == "ok" and answer.json()["seconds"] >= 0
    assert fake.calls == [("pause", {"mode": "wait", "clear_cache": False}),
                          ("reload_weights_keeping_ties", {"weights_path": str(tmp_path)}),
                          ("reset_prefix_cache", {"reset_running_requests": False}), ("resume", None)]
    info = TestClient(server.app).get("/bridge/info")
    assert info.json()["update_count"] == 1
    assert info.json()["policy_version"] == 1 and info.headers["X-Atropos-Policy-Version"] == "1"  # one more


def test_a_frozen_server_reloads_without_draining_and_stays_frozen(fake: FakeEngine, tmp_path: Path) -> None:
    client = TestClient(server.app)
    assert client.post("/bridge/pause", params={"mode": "keep"}).status_code == 200
    assert client.post("/reload_weights", json={"weights_path": str(tmp_path), "policy_version": 3}).status_code == 200
    # no "wait" pause (it would drain the frozen requests on the old weights) and no resume: the caller froze it
    assert fake.calls == [("pause", {"mode": "keep", "clear_cache": False}),
                          ("reload_weights_keeping_ties", {"weights_path": str(tmp_path)}),
                          ("reset_prefix_cache", {"reset_running_requests": True})]
    assert fake.paused and client.get("/bridge/info").json()["policy_version"] == 3


def test_a_reload_sets_the_policy_version_it_is_given(fake: FakeEngine, tmp_path: Path) -> None:
    client = TestClient(server.app)
    assert client.post("/reload_weights", json={"weights_path": str(tmp_path), "policy_version": 12}).status_code == 200
    assert client.get("/health").headers["X-Atropos-Policy-Version"] == "12"
    assert client.get("/bridge/info").json()["policy_version"] == 12


def test_a_failed_reload_is_500_and_generation_resumes(fake: FakeEngine, tmp_path: Path) -> None:
    fake.fail_reload = True
    answer = TestClient(server.app).post("/reload_weights", json={"weights_path": str(tmp_path)})
    assert answer.status_code == 500 and "shapes differ" in answer.json()["detail"]
    assert fake.calls[-1] == ("resume", None)
    missing = TestClient(server.app).post("/reload_weights", json={"weights_path": str(tmp_path / "none")})
    assert missing.status_code == 404


def test_the_api_key_guards_every_route_but_health(fake: FakeEngine) -> None:
    server.state.api_key = "secret"
    client = TestClient(server.app)
    assert client.get("/health").status_code == 200
    assert client.post("/generate", json={"prompt": "hi"}).status_code == 401
    for key, status in (("wrong", 401), ("secret", 200)):
        answer = client.post("/generate", json={"prompt": "hi"}, headers={"Authorization": f"Bearer {key}"})
        assert answer.status_code == status


def test_adapters_load_with_new_ids_and_need_lora_enabled(fake: FakeEngine, tmp_path: Path) -> None:
    client = TestClient(server.app)
    assert client.post("/lora/load", json={"adapter_path": str(tmp_path / "none")}).status_code == 404
    off = client.post("/lora/load", json={"adapter_path": str(tmp_path)})
    assert off.status_code == 400 and "--enable-lora" in off.json()["detail"]
    fake.vllm_config.lora_config = object()
    first = client.post("/lora/load", json={"adapter_path": str(tmp_path), "adapter_name": "step_1"}).json()
    second = client.post("/lora/load", json={"adapter_path": str(tmp_path)}).json()
    assert (first["adapter_id"], second["adapter_id"], second["load_count"]) == (1, 2, 2)
    assert ("remove_lora", 1) in fake.calls
    client.post("/generate", json={"prompt": "hi"})
    assert fake.calls[-1][1][2].lora_int_id == 2
    assert client.post("/lora/unload").json()["previous_name"] == "adapter_1"
    assert client.get("/lora/status").json()["active_adapter_path"] is None


def test_bridge_routes_say_what_this_engine_cannot_do(fake: FakeEngine) -> None:
    client = TestClient(server.app)
    assert client.post("/bridge/sleep").json()["status"] == "not_supported"
    assert client.post("/bridge/wake_up").json()["status"] == "not_supported"
    info = client.get("/bridge/info").json()
    assert info["shared_weights"] is False and info["model_name"] == "tiny"
    paths = {route["path"] for route in client.get("/bridge/list_endpoints").json()["endpoints"]}
    assert {"/generate", "/reload_weights", "/lora/load", "/bridge/pause"} <= paths


def test_openai_routes_need_the_key_use_the_adapter_and_answer_in_openai_shapes(fake: FakeEngine,
                                                                                tmp_path: Path) -> None:
    server.state.api_key = "secret"
    fake.vllm_config.lora_config = object()
    client = TestClient(server.app, headers={"Authorization": "Bearer secret"})
    client.post("/lora/load", json={"adapter_path": str(tmp_path), "adapter_name": "step_1"})
    chat = {"model": "step_1", "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}],
            "max_completion_tokens": 3, "logprobs": True, "top_logprobs": 2}
    assert TestClient(server.app).post("/v1/chat/completions", json=chat).status_code == 401
    answer = client.post("/v1/chat/completions", json=chat)
    assert answer.status_code == 200, answer.text
    prompt, params, adapter = fake.calls[-1][1]
    assert prompt == {"prompt_token_ids": [ord(char) for char in "user: hi\nassistant: "]}
    assert (params.max_tokens, params.logprobs, adapter.lora_name) == (3, 2, "step_1")
    body = answer.json()
    assert body["object"] == "chat.completion" and body["model"] == "step_1"
    assert body["choices"][0]["message"] == {"role": "assistant", "content": " x"}
    assert body["choices"][0]["logprobs"]["content"][0]["top_logprobs"][1] == {"token": "6", "logprob": -1.5,
                                                                                "bytes": [54]}
    assert body["usage"] == {"prompt_tokens": 2, "completion_tokens": 1, "total_tokens": 3}
    text = client.post("/v1/completions", json={"prompt": [[7, 8]], "logprobs": 1, "return_token_ids": True}).json()
    assert fake.calls[-1][1][0] == {"prompt_token_ids": [7, 8]} and fake.calls[-1][1][1].max_tokens == 62
    assert text["choices"][0] == {"index": 0, "text": " x", "finish_reason": "length", "token_ids": [5],
                                  "prompt_token_ids": [7, 8], "logprobs": {
                                      "tokens": ["5"], "token_logprobs": [-0.5], "top_logprobs": [{"5": -0.5}],
                                      "text_offset": [0]}}
    models = client.get("/v1/models").json()["data"]
    assert [model["id"] for model in models] == ["tiny", "step_1"]


@pytest.mark.parametrize("route, body, status, detail", [
    ("/v1/chat/completions", {"model": "m"}, 422, "messages"),
    ("/v1/chat/completions", {"messages": [{"role": "system", "content": "x"}]}, 400, "roles must start"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "stream": True}, 422, "streaming"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "tools": []}, 422, "tools"),
    ("/v1/completions", {"prompt": "x", "n": 2, "temperature": 0.0}, 400, "greedy"),
    ("/v1/completions", {"prompt": ["a", "b"]}, 400, "one prompt"),
    ("/v1/completions", {"prompt": "x", "model": "gpt-4"}, 404, "'gpt-4' is not served here; this server serves tiny"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "model": "tiny-typo"}, 404,
     "(GET /v1/models)"),
])
def test_bad_openai_requests_are_4xx_with_the_reason(fake: FakeEngine, route: str, body: dict[str, Any],
                                                    status: int, detail: str) -> None:
    answer = TestClient(server.app).post(route, json=body)
    assert answer.status_code == status and detail in answer.text, answer.text
