"""The bundled vLLM server (`example_trainer/vllm_api_server.py`), run by the vLLM runtime's python.

Its route checks against a fake engine and Atropos 0.4.0's own test of ``/generate`` run in
the runtime with pytest (installed once, beside the runtime rather than into it). The real
engine (CPU build, the bundled SmolLM2 in float32) is started once for this module, through
the trainer's launcher: token ids, logprobs and prompt logprobs, the environments' client
(`VLLMServer` behind a `ServerManager`, as ``server_type: vllm`` uses it) on ``/generate``
and on the OpenAI routes, the ``openai`` client's chat and text completions, and weights
swapped in place changing what it serves, also when the trainer's remote-server client
(`InferenceServers`) checks and reloads it.
"""

from __future__ import annotations

import asyncio
import importlib.metadata
import os
import shutil
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, Iterator

import httpx
import openai
import pytest
import transformers

from atroposlib.envs.server_handling.configs import APIServerConfig
from atroposlib.envs.server_handling.server_manager import ServerManager
from atroposlib.local.installer import install_command
from atroposlib.local.paths import atropos_home
from atroposlib.local.runtime import Runtime
from example_trainer.inference_servers import InferenceServerError, InferenceServers
from example_trainer.vllm_manager import TrainerVLLM
from tests.real_engine import ROOT, assert_engine_core_forked_and_running_the_model, installed_runtime
from tests.reference_tests import SuiteResult, copy_reference_tests, reference_tests_dir, run_reference_tests

pytestmark = [pytest.mark.real_vllm, pytest.mark.slow]
RUNTIME_CHECKS = Path(__file__).with_name("vllm_api_server_in_runtime.py")
# the versions this venv's pytest runs with, installed beside the runtime for the in-runtime tests
RUNTIME_TEST_TOOLS = ("pytest", "pluggy", "iniconfig", "pytest-asyncio")
QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


def runtime_test_tools(runtime: Runtime) -> Path:
    """A folder (for PYTHONPATH) with pytest and pytest-asyncio for the runtime's python; the
    runtime itself stays as `atropos-vllm install` made it."""
    folder = atropos_home() / "runtime-test-tools"
    if not (folder / "pytest_asyncio").is_dir():
        staging = folder.with_name(f"{folder.name}.tmp-{os.getpid()}")
        pins = [f"{name}=={importlib.metadata.version(name)}" for name in RUNTIME_TEST_TOOLS]
        install_command(runtime.python, ["--no-deps", "--target", str(staging), *pins]).run()
        try:
            staging.rename(folder)
        except OSError:  # another test run installed it meanwhile
            shutil.rmtree(staging)
    return folder


def _run_in_runtime(package: Path) -> SuiteResult:
    runtime = installed_runtime()
    pythonpath = f"{runtime_test_tools(runtime)}{os.pathsep}{ROOT}"
    return run_reference_tests(package, python=runtime.python, env={"PYTHONPATH": pythonpath})


@pytest.fixture(scope="module")
def runtime_suites(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Future[SuiteResult]]]:
    """The route checks and Atropos's own ``/generate`` test, each a pytest run in the runtime,
    started together: each spends most of its ~20 s importing vLLM on one core."""
    runtime_test_tools(installed_runtime())  # installed once, before the two runs look for it
    routes = tmp_path_factory.mktemp("routes") / "reftests"
    routes.mkdir()
    (routes / "__init__.py").write_text("")
    shutil.copy(RUNTIME_CHECKS, routes / "test_vllm_api_server_routes.py")
    packages = {"routes": routes}
    source = reference_tests_dir()
    if source is not None:
        packages["generate"] = copy_reference_tests(source, ["test_vllm_api_server_generate.py"],
                                                    tmp_path_factory.mktemp("generate"))
    with ThreadPoolExecutor(len(packages)) as pool:
        yield {name: pool.submit(_run_in_runtime, package) for name, package in packages.items()}


def _assert_passed(result: SuiteResult) -> None:
    assert not result.failed and result.passed and not result.skipped, f"{result.summary()}\n{result.output}"


def test_route_checks_pass_in_the_runtime(runtime_suites: dict[str, Future[SuiteResult]]) -> None:
    _assert_passed(runtime_suites["routes"].result())


def test_atroposs_own_generate_test_passes_in_the_runtime(runtime_suites: dict[str, Future[SuiteResult]]) -> None:
    if "generate" not in runtime_suites:
        pytest.skip("reference atroposlib 0.4.0 not installed (bench/setup_reference.sh)")
    _assert_passed(runtime_suites["generate"].result())


def _generate(manager: TrainerVLLM, **body: Any) -> dict[str, Any]:
    response = httpx.post(f"http://127.0.0.1:{manager.port}/generate", json=body, timeout=120)
    assert response.status_code == 200, response.text
    return response.json()


def _prompt_ids(model_dir: Path) -> list[int]:
    tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir)
    return list(tokenizer.apply_chat_template(QUESTION, add_generation_prompt=True, tokenize=True, return_dict=True)
                ["input_ids"])


def test_the_engine_core_is_forked_from_the_server_and_runs_the_model(served: TrainerVLLM) -> None:
    assert served.server is not None and served.server.process is not None
    assert_engine_core_forked_and_running_the_model(served.server.process.pid)


def test_generate_returns_token_ids_logprobs_and_prompt_logprobs(served: TrainerVLLM, real_model_dir: Path) -> None:
    ids = _prompt_ids(real_model_dir)
    answer = _generate(served, prompt={"prompt_token_ids": ids}, max_tokens=6, temperature=1.0, seed=3, n=2,
                       logprobs=0, prompt_logprobs=1)
    assert answer["prompt_token_ids"] == ids and len(answer["text"]) == 2
    for tokens, positions in zip(answer["token_ids"], answer["logprobs"]):
        assert 0 < len(tokens) <= 6 and len(positions) == len(tokens)
        assert all(list(position[0]) == [str(token)] and position[0][str(token)] <= 0
                   for token, position in zip(tokens, positions))
    prompt_logprobs = answer["prompt_logprobs"]
    assert len(prompt_logprobs) == len(ids) and prompt_logprobs[0] is None
    assert all(str(token) in position for token, position in zip(ids[1:], prompt_logprobs[1:]))
    assert httpx.get(f"http://127.0.0.1:{served.port}/health_generate", timeout=60).status_code == 200


def test_metrics_count_the_generated_tokens(served: TrainerVLLM, real_model_dir: Path) -> None:
    def generated() -> float:
        text = httpx.get(f"http://127.0.0.1:{served.port}/metrics", timeout=30).text
        return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                   if line.startswith("vllm:generation_tokens_total"))

    before = generated()
    answer = _generate(served, prompt={"prompt_token_ids": _prompt_ids(real_model_dir)}, max_tokens=5,
                       temperature=1.0, seed=1, n=1)
    assert generated() >= before + len(answer["token_ids"][0])


def test_environments_client_samples_and_rescores_through_generate(served: TrainerVLLM, real_model_dir: Path) -> None:
    config = APIServerConfig(base_url=served.base_url, model_name="smollm2", server_type="vllm",
                             tokenizer_name=str(real_model_dir), timeout=120)
    tokenizer = transformers.AutoTokenizer.from_pretrained(real_model_dir)

    async def scenario() -> tuple[Any, Any, list[Any]]:
        manager = ServerManager(configs=[config])
        try:
            ids, outputs, logprobs, reasons = await manager.tokens_and_logprobs_completion(
                input_ids=_prompt_ids(real_model_dir), max_tokens=8, temperature=0.0)
            rescored = await manager.get_logprobs(input_ids=ids + outputs[0], top_k=1)
            async with manager.managed_server(tokenizer=tokenizer) as managed:
                await managed.chat_completion(messages=QUESTION, n=2, max_tokens=8, temperature=1.0)
                nodes = managed.get_state()["nodes"]
        finally:
            await manager.close()
        return (ids, outputs, logprobs, reasons), rescored, nodes

    (ids, outputs, logprobs, reasons), rescored, nodes = asyncio.run(scenario())
    assert len(outputs[0]) == len(logprobs[0]) > 0 and reasons[0] in ("stop", "length")
    for position, (token, sampled) in enumerate(zip(outputs[0], logprobs[0]), start=len(ids)):
        assert rescored["prompt_topk_token_ids"][position] == [token]  # greedy: the best token
        assert rescored["prompt_topk_logprobs"][position][0] == pytest.approx(sampled, abs=0.05)
    assert len(nodes) == 2 and all(len(node.logprobs) == len(node.tokens) for node in nodes)


def test_openai_client_gets_n_chat_and_text_completions(served: TrainerVLLM, real_model_dir: Path) -> None:
    client = openai.OpenAI(base_url=served.base_url, api_key="unused", timeout=120, max_retries=0)
    try:
        assert [model.id for model in client.models.list().data] == ["smollm2"]  # the launcher's served name
        chat = client.chat.completions.create(model="smollm2", messages=QUESTION, n=2, max_completion_tokens=4,
                                              temperature=1.0, seed=1, logprobs=True, top_logprobs=2)
        text = client.completions.create(model="smollm2", prompt="The capital of France is", n=2, max_tokens=4,
                                         stop=["\n\n"], logprobs=1, extra_body={"top_k": 5})
        from_ids = client.completions.create(model="smollm2", prompt=_prompt_ids(real_model_dir), max_tokens=4,
                                             temperature=0.0)
        with pytest.raises(openai.UnprocessableEntityError) as refused:
            client.chat.completions.create(model="smollm2", messages=[], max_tokens=4)
        assert "messages" in refused.value.response.text
    finally:
        client.close()
    assert [choice.index for choice in chat.choices] == [0, 1] and chat.object == "chat.completion"
    assert all(choice.message.role == "assistant" and choice.message.content for choice in chat.choices)
    assert all(len(choice.logprobs.content[0].top_logprobs) == 2 for choice in chat.choices)
    assert chat.usage.prompt_tokens == len(_prompt_ids(real_model_dir)) and 0 < chat.usage.completion_tokens <= 8
    assert len(text.choices) == 2 and all(choice.text and choice.logprobs.tokens for choice in text.choices)
    assert from_ids.choices[0].finish_reason in ("stop", "length") and from_ids.choices[0].text


def test_environments_client_chats_through_the_openai_route(served: TrainerVLLM, real_model_dir: Path) -> None:
    config = APIServerConfig(base_url=served.base_url, model_name="smollm2", server_type="vllm",
                             tokenizer_name=str(real_model_dir), timeout=120)

    async def scenario() -> Any:
        manager = ServerManager(configs=[config])
        try:
            return await manager.chat_completion(messages=QUESTION, n=2, max_tokens=4, temperature=1.0)
        finally:
            await manager.close()

    answer = asyncio.run(scenario())
    assert len(answer.choices) == 2 and all(choice.message.content for choice in answer.choices)


def _scaled_final_norm(model_dir: Path, out: Path) -> Path:
    """A copy of the model whose final norm weights are doubled (sharper next-token distributions)."""
    from safetensors.torch import load_file, save_file

    out.mkdir()
    for item in model_dir.iterdir():
        if item.suffix != ".safetensors":
            shutil.copy(item, out / item.name)
    for weights in model_dir.glob("*.safetensors"):
        tensors = load_file(weights)
        tensors["model.norm.weight"] = tensors["model.norm.weight"] * 2
        save_file(tensors, out / weights.name, metadata={"format": "pt"})
    return out


def test_reloaded_weights_change_what_is_served_and_reload_back(
        served: TrainerVLLM, real_model_dir: Path, tmp_path: Path) -> None:
    ids = _prompt_ids(real_model_dir)

    def scores() -> list[float]:
        answer = _generate(served, prompt={"prompt_token_ids": ids}, max_tokens=1, temperature=0.0, prompt_logprobs=0)
        return [position[str(token)] for token, position in zip(ids[1:], answer["prompt_logprobs"][1:])]

    before = scores()
    assert served.reload_weights(str(_scaled_final_norm(real_model_dir, tmp_path / "scaled")), policy_version=7) > 0
    assert httpx.get(f"http://127.0.0.1:{served.port}/bridge/info").json()["policy_version"] == 7
    changed = scores()
    assert max(abs(a - b) for a, b in zip(before, changed)) > 0.1
    served.reload_weights(str(real_model_dir), policy_version=0)
    assert scores() == pytest.approx(before, abs=1e-3)


def test_a_frozen_server_is_reloaded_frozen_and_its_requests_go_on_with_the_new_weights(
        served: TrainerVLLM, real_model_dir: Path, tmp_path: Path) -> None:
    """The trainer's sync in ``reload`` mode: vLLM frozen for a training step is reloaded as it is
    (no drain on the old weights), and a request that waited frozen is then sampled by the new."""
    ids, scaled = _prompt_ids(real_model_dir), str(_scaled_final_norm(real_model_dir, tmp_path / "scaled"))
    root = f"http://127.0.0.1:{served.port}"
    assert served.pause_generation()
    try:
        with ThreadPoolExecutor(1) as pool:
            frozen = pool.submit(_generate, served, prompt={"prompt_token_ids": ids}, max_tokens=8, temperature=1.0,
                                 logprobs=0)
            time.sleep(1.0)  # the request reaches the engine and waits there
            served.reload_weights(scaled, policy_version=7)
            assert httpx.get(f"{root}/bridge/is_paused").json()["paused"] and not frozen.done()
            served.resume_generation()
            answer = frozen.result(timeout=120)
        tokens, positions = answer["token_ids"][0], answer["logprobs"][0]
        rescored = _generate(served, prompt={"prompt_token_ids": ids + tokens}, max_tokens=1, temperature=1.0,
                             prompt_logprobs=0)["prompt_logprobs"][len(ids):]
        assert [position[0][str(token)] for token, position in zip(tokens, positions)] == pytest.approx(
            [position[str(token)] for token, position in zip(tokens, rescored)], abs=2e-3)
        assert answer["policy_version"] == 0  # reported as served when it arrived: never younger than it is
    finally:
        served.resume_generation()
        served.reload_weights(str(real_model_dir), policy_version=0)


def test_the_trainer_checks_it_and_reloads_it_as_a_remote_inference_server(
        served: TrainerVLLM, real_model_dir: Path, tmp_path: Path) -> None:
    servers = InferenceServers((f"http://127.0.0.1:{served.port}",))
    servers.check()  # /health, then /bridge/info: the route only this server has
    assert servers.reload(str(real_model_dir), policy_version=0) > 0
    with pytest.raises(InferenceServerError, match="sees no folder .* on a file system the inference nodes see"):
        servers.reload(str(tmp_path / "not-shared"), policy_version=1)
