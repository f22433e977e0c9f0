"""Groups say how their rollouts were sampled: sampling parameters and policy version.

Environments here sample from a scripted inference server that reports a policy version
(``X-Atropos-Policy-Version``) when a test sets one, through `managed_server()` (vLLM
backend, rollouts matched to nodes by their tokens) or plain ``chat_completion`` (OpenAI
backend, the environment tokenizes itself), and the groups are read where they leave the
environment: the JSONL of process mode, the payload serve mode sends.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator, Optional

import pytest
import transformers
import uvicorn

from atroposlib.envs.base import APIServerConfig, BaseEnv, BaseEnvConfig
from atroposlib.envs.process_mode import process
from atroposlib.envs.sampling_stamp import stamp_group
from atroposlib.envs.serve_mode import run_item, step_checks
from atroposlib.envs.server_handling.managed_server import ManagedServer
from atroposlib.envs.server_handling.managed_server_proxy import create_app
from atroposlib.envs.server_handling.proxy_client import create_proxy_session
from atroposlib.envs.server_handling.sampling_record import (
    SampledCompletion,
    SamplingRecord,
    recording,
    sampling_params,
)
from atroposlib.envs.server_handling.server_manager import ServerManager
from atroposlib.envs.server_handling.vllm_server import VLLMServer
from atroposlib.policy_version import group_policy_version
from atroposlib.wire import ScoredData
from tests.envs.test_base import make_env
from tests.environments.scripted_inference import ScriptedInference
from tests.helpers import free_port

QUESTION = [{"role": "user", "content": "What is 2 + 2?"}]
# (n, sampling settings, the version the server reports while answering)
Call = tuple[int, dict[str, Any], Optional[int]]


@pytest.fixture(scope="module")
def tokenizer(tokenizer_dir: Path) -> Any:
    return transformers.AutoTokenizer.from_pretrained(tokenizer_dir)


@pytest.fixture(scope="module")
def scripted(tokenizer: Any) -> Iterator[ScriptedInference]:
    answers = itertools.count()  # every answer differs, so every node has tokens of its own
    with ScriptedInference(lambda prompt, index: f"The answer is {next(answers)}", tokenizer) as server:
        yield server


@pytest.fixture
def inference(scripted: ScriptedInference) -> ScriptedInference:
    scripted.policy_version = scripted.generate_body_version = None
    return scripted


def backend(inference: ScriptedInference, tokenizer_dir: Path, server_type: str, **settings: Any) -> APIServerConfig:
    return APIServerConfig(base_url=f"{inference.url}/v1", model_name="scripted", api_key="x", server_type=server_type,
                           tokenizer_name=str(tokenizer_dir), health_check=False, timeout=10, **settings)


class SamplingEnv(BaseEnv):
    """One group per item from the completions of `calls`, through `managed_server()` or,
    with ``managed=False``, plain ``chat_completion`` answers it tokenizes itself; `own`
    is what the environment writes into the group itself."""

    name = "sampling"

    def __init__(self, config: BaseEnvConfig, servers: list[APIServerConfig], inference: ScriptedInference,
                 calls: list[Call], managed: bool = True, own: Optional[dict[str, Any]] = None) -> None:
        super().__init__(config, servers)
        self.inference, self.calls, self.managed, self.own = inference, calls, managed, own or {}

    async def setup(self) -> None:
        pass

    async def get_next_item(self) -> dict[str, Any]:
        return {"messages": QUESTION}

    async def collect_trajectories(self, item: Any) -> tuple[dict[str, Any], list[Any]]:
        sequences: list[list[int]] = []
        for n, sampling, version in self.calls:
            self.inference.policy_version = version
            sequences += await self.sample(n, sampling)
        group = {"tokens": sequences, "masks": [list(s) for s in sequences],
                 "scores": [float(i) for i in range(len(sequences))]}
        group.update(json.loads(json.dumps(self.own)))
        return group, []

    async def sample(self, n: int, sampling: dict[str, Any]) -> list[list[int]]:
        if self.managed:
            async with self.server.managed_server(tokenizer=self.tokenizer) as managed:
                await managed.chat_completion(messages=QUESTION, n=n, max_tokens=8, **sampling)
                return [node.tokens for node in managed.get_state()["nodes"]]
        response = await self.server.chat_completion(messages=QUESTION, n=n, max_tokens=8, **sampling)
        return [self.tokenizer.encode(f"Q: 2 + 2? A: {choice.message.content}") for choice in response.choices]


def make_sampling_env(tmp_path: Path, tokenizer_dir: Path, inference: ScriptedInference, calls: list[Call],
                      managed: bool = True, env_class: type = SamplingEnv, **kwargs: Any) -> SamplingEnv:
    server = backend(inference, tokenizer_dir, "vllm" if managed else "openai", **kwargs.pop("server", {}))
    settings = dict(tokenizer_name=str(tokenizer_dir), use_wandb=False, total_steps=1,
                    group_size=sum(n for n, _, _ in calls), ensure_scores_are_not_same=False,
                    data_path_to_save_groups=str(tmp_path / "groups.jsonl"))
    config = BaseEnvConfig(**{**settings, **kwargs.pop("config", {})})
    return env_class(config, [server], inference, calls, managed=managed, **kwargs)


def processed(env: SamplingEnv) -> list[dict[str, Any]]:
    """Run process mode; the groups written."""
    asyncio.run(process(env))
    path = Path(env.config.data_path_to_save_groups or "")
    return [json.loads(line) for line in path.read_text().splitlines()]


class CapturingApi:
    """The trajectory API client, reduced to what it is sent."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, Any]] = []

    async def submit(self, path: str, body: Any) -> None:
        self.sent.append((path, body))


def served(env: SamplingEnv) -> dict[str, Any]:
    """One item through serve mode's worker; the group that reached the API."""
    env.api = CapturingApi()

    async def one_item() -> None:
        try:
            await run_item(env, "key", await env.get_next_item())
        finally:
            await env.server.close()

    asyncio.run(one_item())
    [(path, payload)] = env.api.sent
    assert path == "/scored_data"
    ScoredData.model_validate(payload)  # what the API accepts
    return payload


def test_managed_rollouts_are_stamped_in_process_mode(tmp_path: Path, tokenizer_dir: Path,
                                                      inference: ScriptedInference) -> None:
    env = make_sampling_env(tmp_path, tokenizer_dir, inference, [(4, {"temperature": 0.7, "top_p": 0.9}, 5)])
    [group] = processed(env)
    assert group["generation_params"] == {"temperature": 0.7, "top_p": 0.9, "policy_version": 5}
    assert group["overrides"] is None
    assert group_policy_version(group) == 5


def test_managed_rollouts_are_stamped_in_what_serve_mode_sends(tmp_path: Path, tokenizer_dir: Path,
                                                               inference: ScriptedInference) -> None:
    env = make_sampling_env(tmp_path, tokenizer_dir, inference, [(4, {"temperature": 0.7, "top_p": 0.9}, 5)])
    payload = served(env)
    assert payload["generation_params"] == {"temperature": 0.7, "top_p": 0.9, "policy_version": 5}
    assert not payload.get("overrides")


@pytest.mark.parametrize("n_kwarg_is_ignored", [False, True])
def test_plain_chat_completion_gets_group_level_params(tmp_path: Path, tokenizer_dir: Path,
                                                       inference: ScriptedInference, n_kwarg_is_ignored: bool) -> None:
    sampling = {"temperature": 0.7, "extra_body": {"top_k": 20, "min_p": 0.05}}
    env = make_sampling_env(tmp_path, tokenizer_dir, inference, [(4, sampling, 5)], managed=False,
                            server={"n_kwarg_is_ignored": n_kwarg_is_ignored})
    [group] = processed(env)
    assert group["generation_params"] == {"temperature": 0.7, "top_k": 20, "min_p": 0.05, "policy_version": 5}
    assert group["overrides"] is None
    expected_requests = 4 if n_kwarg_is_ignored else 1
    assert [r["top_k"] for r in inference.requests[-expected_requests:]] == [20] * expected_requests


def test_rollouts_sampled_at_other_temperatures_and_versions_carry_overrides(
        tmp_path: Path, tokenizer_dir: Path, inference: ScriptedInference) -> None:
    calls = [(1, {"temperature": 1.0}, 3), (2, {"temperature": 0.6}, 4), (1, {"temperature": 0.6}, 3)]
    [group] = processed(make_sampling_env(tmp_path, tokenizer_dir, inference, calls))
    # the values most rollouts share are the group's; the others are per rollout
    assert group["generation_params"] == {"temperature": 0.6, "policy_version": 3}
    assert group["overrides"] == [{"temperature": 1.0}, {"policy_version": 4}, {"policy_version": 4}, {}]
    assert group_policy_version(group) == 3


def test_plain_completions_are_taken_together(tmp_path: Path, tokenizer_dir: Path,
                                              inference: ScriptedInference) -> None:
    calls = [(2, {"temperature": 0.6, "top_p": 0.9}, 6), (2, {"temperature": 1.0, "top_p": 0.9}, 4)]
    [group] = processed(make_sampling_env(tmp_path, tokenizer_dir, inference, calls, managed=False))
    # no rollout says which request it came from: what all requests share, and the oldest version
    assert group["generation_params"] == {"top_p": 0.9, "policy_version": 4}


def test_a_server_that_reports_no_version_leaves_it_unknown(tmp_path: Path, tokenizer_dir: Path,
                                                            inference: ScriptedInference) -> None:
    [group] = processed(make_sampling_env(tmp_path, tokenizer_dir, inference, [(2, {"temperature": 0.8}, None)]))
    assert group["generation_params"] == {"temperature": 0.8}
    mixed = make_sampling_env(tmp_path / "mixed", tokenizer_dir, inference,
                              [(1, {"temperature": 0.8}, 7), (1, {"temperature": 0.8}, None)])
    [group] = processed(mixed)
    assert group["generation_params"] == {"temperature": 0.8}
    assert group["overrides"] == [{"policy_version": 7}, {}]
    assert group_policy_version(group) is None


def test_what_the_environment_set_itself_is_kept(tmp_path: Path, tokenizer_dir: Path,
                                                 inference: ScriptedInference) -> None:
    own = {"generation_params": {"temperature": 0.5}, "overrides": [{"top_p": 0.3, "sft": True}, {}],
           "group_overrides": {"min_p": 0.2}}
    calls = [(1, {"temperature": 0.7, "top_p": 0.9, "min_p": 0.1}, 2), (1, {"temperature": 0.7, "top_p": 0.95}, 2)]
    [group] = processed(make_sampling_env(tmp_path, tokenizer_dir, inference, calls, own=own))
    assert group["generation_params"] == {"temperature": 0.5, "top_p": 0.9, "policy_version": 2}
    assert group["overrides"] == [{"top_p": 0.3, "sft": True}, {"top_p": 0.95}]
    assert group["group_overrides"] == {"min_p": 0.2}


def test_groups_made_without_inference_get_nothing(tmp_path: Path, tokenizer_dir: Path) -> None:
    env = make_env(tokenizer_dir, tmp_path, total_steps=1, data_path_to_save_groups=str(tmp_path / "g.jsonl"))
    asyncio.run(process(env))
    [group] = [json.loads(line) for line in (tmp_path / "g.jsonl").read_text().splitlines()]
    assert group.get("generation_params") is None and group["overrides"] == []


class PerItemTemperature(SamplingEnv):
    """Items collected concurrently, each at its own temperature, over interleaved calls."""

    temperatures = itertools.cycle([0.3, 0.9])

    async def get_next_item(self) -> dict[str, Any]:
        return {"temperature": next(self.temperatures)}

    async def collect_trajectories(self, item: Any) -> tuple[dict[str, Any], list[Any]]:
        sequences: list[list[int]] = []
        for _ in range(2):
            sequences += await self.sample(1, {"temperature": item["temperature"]})
            await asyncio.sleep(0.05)  # the other item's calls land in between
        return {"tokens": sequences, "masks": sequences, "scores": [0.0, 1.0]}, []


def test_items_collected_concurrently_keep_their_records_apart(tmp_path: Path, tokenizer_dir: Path,
                                                               inference: ScriptedInference) -> None:
    env = make_sampling_env(tmp_path, tokenizer_dir, inference, [(2, {}, None)], managed=False,
                            env_class=PerItemTemperature, config={"process_concurrency": 2, "total_steps": 4})
    groups = processed(env)
    assert sorted(g["generation_params"]["temperature"] for g in groups) == [0.3, 0.3, 0.9, 0.9]


def test_sampling_params_come_from_the_request_and_its_extra_body() -> None:
    request = {"temperature": 0.7, "top_p": None, "max_tokens": 5, "n": 2, "top_k": 50,
               "extra_body": {"top_k": 20, "min_p": 0.05, "reasoning": {"enabled": True}}}
    assert sampling_params(request) == {"temperature": 0.7, "top_k": 20, "min_p": 0.05}


def test_stamping_copies_overrides_an_environment_shares_between_rollouts() -> None:
    record = SamplingRecord()
    record.add(SampledCompletion({"temperature": 0.7}, 1, (1, 2)))
    record.add(SampledCompletion({"temperature": 1.0}, 1, (1, 3)))
    shared: dict[str, Any] = {}
    group = {"tokens": [[1, 2], [1, 3], [1, 2]], "overrides": [shared, shared]}
    stamp_group(group, record)
    assert shared == {}
    assert group["generation_params"] == {"temperature": 0.7, "policy_version": 1}
    assert group["overrides"] == [{}, {"temperature": 1.0}, {}]


def test_managed_nodes_say_how_they_were_sampled_over_turns(tokenizer_dir: Path, tokenizer: Any,
                                                            inference: ScriptedInference) -> None:
    async def conversation() -> list[Any]:
        server = VLLMServer(backend(inference, tokenizer_dir, "vllm"))
        managed = ManagedServer(server, tokenizer)
        try:
            inference.generate_body_version = 3  # in the /generate answer only
            first = await managed.chat_completion(messages=QUESTION, temperature=0.6, max_tokens=8)
            turn_one = managed.get_state()["nodes"][0]
            inference.generate_body_version, inference.policy_version = None, 5
            messages = QUESTION + [{"role": "assistant", "content": first.choices[0].message.content},
                                   {"role": "user", "content": "Sure?"}]
            await managed.chat_completion(messages=messages, temperature=0.8, top_k=10, max_tokens=8)
            return [turn_one, managed.get_state()["nodes"][0]]
        finally:
            await server.close()

    turn_one, extended = asyncio.run(conversation())
    assert turn_one.metadata == {"finish_reason": "stop", "generation_params": {"temperature": 0.6},
                                 "policy_version": 3}
    # the last turn's parameters; the oldest turn's version, as its completion is trained too
    assert extended.metadata == {"finish_reason": "stop", "generation_params": {"temperature": 0.8, "top_k": 10},
                                 "policy_version": 3}


@contextmanager
def serving(app: Any) -> Iterator[str]:
    """`app` on a free loopback port, in a thread; its base URL."""
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(10)


def test_proxy_sessions_record_what_the_proxy_sampled(tokenizer_dir: Path, tokenizer: Any,
                                                      inference: ScriptedInference) -> None:
    inference.policy_version = 4
    app = create_app(ServerManager([backend(inference, tokenizer_dir, "vllm")]), tokenizer, "scripted")

    async def session(proxy_url: str) -> tuple[SamplingRecord, list[Any]]:
        with recording() as record:
            async with await create_proxy_session(proxy_url, model_name="scripted") as proxied:
                await proxied.chat_completion(messages=QUESTION, n=2, max_tokens=8, temperature=0.7, top_k=5)
                nodes = proxied.get_state()["nodes"]
        return record, nodes

    with serving(app) as proxy_url:
        record, nodes = asyncio.run(session(proxy_url))
    assert [c.tokens for c in record.completions] == [tuple(node.tokens) for node in nodes]
    assert {(tuple(sorted(c.params.items())), c.version) for c in record.completions} == {
        ((("temperature", 0.7), ("top_k", 5)), 4)}


class FailingEvaluation(SamplingEnv):
    async def evaluate(self, *args: Any, **kwargs: Any) -> None:
        raise RuntimeError("the evaluation set is missing")


def test_a_failing_evaluation_is_logged_with_its_traceback_and_serving_goes_on(
        tmp_path: Path, tokenizer_dir: Path, inference: ScriptedInference, caplog: pytest.LogCaptureFixture) -> None:
    env = make_sampling_env(tmp_path, tokenizer_dir, inference, [(1, {}, None)], env_class=FailingEvaluation,
                            config={"steps_per_eval": 1})

    async def two_steps() -> tuple[Any, Any]:
        await step_checks(env, {"current_step": 1})
        first = env.eval_runner
        await asyncio.wait([first])
        await asyncio.sleep(0)  # done callbacks run on the next turn of the loop
        await step_checks(env, {"current_step": 2})
        second = env.eval_runner
        await asyncio.wait([second])
        await asyncio.sleep(0)
        await env.server.close()
        return first, second

    with caplog.at_level(logging.ERROR, logger="atroposlib.envs"):
        first, second = asyncio.run(two_steps())
    assert first is not second and env.curr_step == 2
    failures = [r for r in caplog.records if r.getMessage() == "evaluate() failed; serving goes on"]
    assert len(failures) == 2
    assert "RuntimeError: the evaluation set is missing" in caplog.text and "Traceback" in caplog.text
