"""ServerManager against a real OpenAI-compatible server process."""

from __future__ import annotations

import asyncio

import pytest

from atroposlib.envs.server_handling.configs import APIServerConfig, ServerBaseline
from atroposlib.envs.server_handling.reasoning import ReasoningConfig
from atroposlib.envs.server_handling.server_manager import ServerManager, slurm_inference_urls


def manager(url: str, **kwargs) -> ServerManager:
    return ServerManager(APIServerConfig(base_url=url, api_key="x", model_name="fake-model"), **kwargs)


def test_large_n_is_split_and_choices_renumbered(inference_url: str) -> None:
    async def scenario():
        m = manager(inference_url, max_n_completions=3)
        try:
            return await m.chat_completion(messages=[{"role": "user", "content": "What is 2 + 3?"}], n=7)
        finally:
            await m.close()

    response = asyncio.run(scenario())
    assert [c.index for c in response.choices] == list(range(7))


def test_completion_and_model_override(inference_url: str) -> None:
    async def scenario():
        m = manager(inference_url)
        try:
            return await m.completion(prompt="1 + 1", n=2, model="ignored", split="eval")
        finally:
            await m.close()

    response = asyncio.run(scenario())
    assert response.model == "fake-model" and len(response.choices) == 2


def test_providers_that_ignore_n_are_detected(inference_url: str, monkeypatch) -> None:
    config = APIServerConfig(base_url=inference_url, api_key="x", n_kwarg_is_ignored=True)

    async def scenario():
        m = ServerManager(config)
        try:
            return await m.chat_completion(messages=[{"role": "user", "content": "1 + 1"}], n=3)
        finally:
            await m.close()

    assert [c.index for c in asyncio.run(scenario()).choices] == [0, 1, 2]


def test_baseline_discovers_local_ports_and_reachability() -> None:
    m = ServerManager(ServerBaseline(model_name="m"))
    assert [s.config.base_url for s in m.servers] == [f"http://localhost:{p}/v1" for p in range(9004, 9008)]
    assert len(asyncio.run(m.unreachable())) == 4


def test_slurm_variables_are_read_only_with_slurm(monkeypatch) -> None:
    monkeypatch.setenv("SLURM_JOB_NODELIST", "node[1-3]")
    m = ServerManager(ServerBaseline())
    assert m.servers[0].config.base_url == "http://localhost:9004/v1"
    monkeypatch.setattr("shutil.which", lambda name: None)
    with pytest.raises(ValueError, match="scontrol is not on PATH"):
        slurm_inference_urls()


def test_reasoning_injection() -> None:
    config = ReasoningConfig(effort="high")
    kwargs = {"max_tokens": 10}
    config.inject(kwargs, "http://localhost:9001/v1")
    assert kwargs["extra_body"] == {"reasoning": {"enabled": True, "effort": "high"}}
    openai_kwargs = {"max_tokens": 10}
    config.inject(openai_kwargs, "https://api.openai.com/v1")
    assert openai_kwargs == {"extra_body": {"reasoning_effort": "high"}, "temperature": 1.0, "max_completion_tokens": 10}
    with pytest.raises(ValueError):
        ReasoningConfig(effort="extreme")


def test_unknown_backend_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="unknown server_type"):
        ServerManager(APIServerConfig.model_construct(base_url="http://x/v1", server_type="tgi"))


def test_a_base_url_without_a_path_gets_openais_v1(caplog: pytest.LogCaptureFixture) -> None:
    from atroposlib.envs.server_handling.configs import APIServerConfig

    assert APIServerConfig(base_url="http://127.0.0.1:9001").base_url == "http://127.0.0.1:9001/v1"
    assert "has no path: using http://127.0.0.1:9001/v1" in caplog.text
    assert APIServerConfig(base_url="http://h:9001/", server_type="vllm").base_url == "http://h:9001/v1"
    assert APIServerConfig(base_url="http://h:9001/v1").base_url == "http://h:9001/v1"
    assert APIServerConfig(base_url="http://h:9001/api/v2").base_url == "http://h:9001/api/v2"
    assert APIServerConfig(base_url="http://h:9001", server_type="trl").base_url == "http://h:9001"
