"""environments/verifiers_server.py, offline, with a verifiers environment defined here: sums
from a dataset built in the test, scored by a rubric of a plain and an async reward function
(weights 1.0 and 0.5), in a single-turn and a two-turn variant. Played against the scripted
inference server in ``process`` (the server's tokens and logprobs; an OpenAI endpoint
tokenised instead), ``serve`` (groups a strict run-api accepts) and ``evaluate``; plus the
shipped YAML, the load arguments and the one-line errors."""

from __future__ import annotations

import json
import re
import signal
import sys
import types
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import pytest
from transformers import AutoTokenizer

from atroposlib.envs.cli import resolve_settings
from atroposlib.envs.server_handling.resolve import ConfigError
from tests.environments.harness import ROOT, process_groups, run_cli
from tests.environments.scripted_inference import ScriptedInference
from tests.helpers import ApiProcess

vf = pytest.importorskip("verifiers", reason="the verifiers extra: pip install 'atroposlib[verifiers]'")
from datasets import Dataset  # noqa: E402

from environments import verifiers_server  # noqa: E402

SCRIPT = "verifiers_server.py"
MODULE = "atropos_test_tiny_sums"
ENV_ID = "tests/atropos-test-tiny-sums@0.1.0"  # owner and version are stripped; '-' is read as '_'
SYSTEM = "Reply with the number only."
FOLLOW_UP = "Are you sure?"
TRAIN = [{"question": f"What is {a} + {b}?", "answer": str(a + b)} for a, b in ((2, 3), (4, 4), (1, 6))]
EVAL = [{"question": f"What is {a} + {b}?", "answer": str(a + b)} for a, b in ((3, 3), (2, 7))]
GOLD = {row["question"]: row["answer"] for row in TRAIN + EVAL}
QUESTION = re.compile(r"What is \d \+ \d\?")
REPLY = re.compile(r"<\|assistant\|>(.*?)<\|end\|>", re.DOTALL)
RIGHT, WRONG = 1.5, 0.0  # exact (1.0) and short (0.5), or neither


def exact_answer(completion: list[dict[str, Any]], answer: str) -> float:
    """A plain reward function: the last reply is the answer."""
    return 1.0 if completion[-1]["content"].strip() == answer else 0.0


async def short_reply(completion: list[dict[str, Any]]) -> float:
    """An async reward function: every reply is at most 10 characters."""
    return 1.0 if all(len(m["content"]) <= 10 for m in completion if m["role"] == "assistant") else 0.0


class AskTwice(vf.MultiTurnEnv):
    """Two turns: after the first reply the environment asks whether the model is sure."""

    async def env_response(self, messages: Any, state: Any, **kwargs: Any) -> list[dict[str, str]]:
        return [{"role": "user", "content": FOLLOW_UP}]


def load_environment(multi_turn: bool = False) -> Any:
    rubric = vf.Rubric(funcs=[exact_answer, short_reply], weights=[1.0, 0.5])
    data = {"dataset": Dataset.from_list(TRAIN), "eval_dataset": Dataset.from_list(EVAL), "system_prompt": SYSTEM,
            "rubric": rubric}
    return AskTwice(max_turns=2, **data) if multi_turn else vf.SingleTurnEnv(**data)


@pytest.fixture
def tiny_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """The environment above, installed as the module verifiers imports for ENV_ID."""
    module = types.ModuleType(MODULE)
    module.load_environment = load_environment  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, MODULE, module)


@pytest.fixture(scope="module")
def tokenizer(tokenizer_dir: Path) -> Any:
    return AutoTokenizer.from_pretrained(str(tokenizer_dir))


class Alternating:
    """Per question: right ("5"), wrong ("I think it is 6"), right, ...; a follow-up gets the
    previous reply again."""

    def __init__(self) -> None:
        self.asked: Counter[str] = Counter()

    def __call__(self, prompt: str, index: int) -> str:
        if FOLLOW_UP in prompt:
            return REPLY.findall(prompt)[-1]
        question = QUESTION.findall(prompt)[-1]
        self.asked[question] += 1
        gold = int(GOLD[question])
        return str(gold) if self.asked[question] % 2 == 1 else f"I think it is {gold + 1}"


def _check_scores(group: dict[str, Any]) -> None:
    for score, messages in zip(group["scores"], group["messages"]):
        assert messages[0] == {"role": "system", "content": SYSTEM}
        right = messages[-1]["content"] == GOLD[messages[1]["content"]]
        assert score == (RIGHT if right else WRONG)


def _trained(tokenizer: Any, tokens: list[int], masks: list[int]) -> str:
    return tokenizer.decode([token for token, mask in zip(tokens, masks) if mask != -100])


def test_process_writes_the_servers_tokens_scored_by_the_rubric(
        tiny_env: None, tokenizer_dir: Path, tokenizer: Any, tmp_path: Path) -> None:
    with ScriptedInference(Alternating(), tokenizer) as server:
        groups = process_groups(SCRIPT, tmp_path, server.url, tokenizer_dir, "--env.vf_env_name", ENV_ID,
                                "--env.max_token_length", "64", steps=2, group_size=4, server_type="vllm")
    assert len(groups) == 2
    assert {group["messages"][0][1]["content"] for group in groups} == {TRAIN[0]["question"], TRAIN[1]["question"]}
    for group in groups:
        assert sorted(group["scores"]) == [WRONG, WRONG, RIGHT, RIGHT]
        _check_scores(group)
        for tokens, masks, logprobs, messages in zip(group["tokens"], group["masks"], group["inference_logprobs"],
                                                     group["messages"]):
            assert [m["role"] for m in messages] == ["system", "user", "assistant"]
            assert len(tokens) == len(masks) == len(logprobs) and masks[0] == -100
            assert _trained(tokenizer, tokens, masks) == messages[-1]["content"]
            assert all(lp == pytest.approx(-0.1) for lp, mask in zip(logprobs, masks) if mask != -100)
    sampled = [request for request in server.requests if "prompt" in request]  # /generate bodies
    assert len(sampled) == 8
    assert all(r["n"] == 1 and r["temperature"] == 1.0 and r["max_tokens"] == 64 and "extra_body" not in r
               for r in sampled)


def test_two_turn_rollouts_train_on_both_replies_of_one_node(
        tiny_env: None, tokenizer_dir: Path, tokenizer: Any, tmp_path: Path) -> None:
    with ScriptedInference(Alternating(), tokenizer) as server:
        groups = process_groups(SCRIPT, tmp_path, server.url, tokenizer_dir, "--env.vf_env_name", ENV_ID,
                                "--env.env_args", '{"multi_turn": true}', steps=1, group_size=2, server_type="vllm")
    (group,) = groups
    assert sorted(group["scores"]) == [WRONG, RIGHT]
    _check_scores(group)
    for tokens, masks, messages in zip(group["tokens"], group["masks"], group["messages"]):
        assert [m["role"] for m in messages] == ["system", "user", "assistant", "user", "assistant"]
        assert messages[3]["content"] == FOLLOW_UP and messages[2]["content"] == messages[4]["content"]
        assert _trained(tokenizer, tokens, masks) == messages[2]["content"] + messages[4]["content"]


def test_process_with_an_openai_endpoint_tokenises_the_conversation(
        tiny_env: None, tokenizer_dir: Path, tokenizer: Any, tmp_path: Path) -> None:
    with ScriptedInference(Alternating(), tokenizer) as server:
        groups = process_groups(SCRIPT, tmp_path, server.url, tokenizer_dir, "--env.vf_env_name", ENV_ID,
                                "--env.max_token_length", "64", steps=1, group_size=2, server_type="openai")
    (group,) = groups
    assert sorted(group["scores"]) == [WRONG, RIGHT] and not group.get("inference_logprobs")
    _check_scores(group)
    for tokens, masks, messages in zip(group["tokens"], group["masks"], group["messages"]):
        trained = _trained(tokenizer, tokens, masks)
        assert messages[-1]["content"] in trained and SYSTEM not in trained
    chats = server.requests
    assert len(chats) == 2 and all(r["temperature"] == 1.0 and r["max_completion_tokens"] == 64 for r in chats)


def test_serve_sends_groups_a_strict_run_api_accepts(
        tiny_env: None, tokenizer_dir: Path, tokenizer: Any, tmp_path: Path) -> None:
    trainer = {"wandb_group": None, "wandb_project": None, "batch_size": 4, "max_token_len": 4096,
               "checkpoint_dir": "", "save_checkpoint_interval": -1, "starting_step": 0, "num_steps": 1}
    with ScriptedInference(Alternating(), tokenizer) as server, \
            ApiProcess(tmp_path / "api", "--validation", "strict") as api:
        assert httpx.post(f"{api.url}/register", json=trainer).status_code == 200
        assert httpx.get(f"{api.url}/batch").json() == {"batch": None}  # the trainer has started
        # serve ends once the groups queued at the API cover the run's one step
        run_cli(SCRIPT, "serve", "--env.vf_env_name", ENV_ID, "--env.rollout_server_url", api.url,
                "--env.tokenizer_name", str(tokenizer_dir), "--env.group_size", "4", "--env.total_steps", "1",
                "--env.steps_per_eval", "0", "--env.max_token_length", "64", "--env.use_wandb", "false",
                "--env.spool_dir", str(tmp_path / "spool"), "--openai.base_url", f"{server.url}/v1",
                "--openai.model_name", "scripted", "--openai.server_type", "vllm",
                "--openai.tokenizer_name", str(tokenizer_dir))
        batch = httpx.get(f"{api.url}/batch").json()["batch"]
    assert "refused" not in api.log().lower()
    assert batch and sum(len(item["tokens"]) for item in batch) == 4
    for item in batch:
        assert set(item["scores"]) == {WRONG, RIGHT}  # groups scored all alike are not sent
        _check_scores(item)
        assert all(len(lp) == len(tokens) for lp, tokens in zip(item["inference_logprobs"], item["tokens"]))


def test_evaluate_plays_the_eval_rows_and_reports_each_reward_function(
        tiny_env: None, tokenizer_dir: Path, tokenizer: Any, tmp_path: Path) -> None:
    with ScriptedInference(Alternating(), tokenizer) as server:
        run_cli(SCRIPT, "evaluate", "--env.vf_env_name", ENV_ID, "--env.tokenizer_name", str(tokenizer_dir),
                "--env.use_wandb", "false", "--env.data_dir_to_save_evals", str(tmp_path / "eval"),
                "--openai.base_url", f"{server.url}/v1", "--openai.model_name", "scripted",
                "--openai.server_type", "vllm", "--openai.tokenizer_name", str(tokenizer_dir))
    metrics = json.loads((tmp_path / "eval" / "metrics.json").read_text())["results"]["all"]
    # num_turns: the metric (weight 0) every verifiers multi-turn environment, single-turn ones included, adds
    assert metrics == {"eval/avg_total_score": RIGHT, "eval/exact_answer": 1.0, "eval/short_reply": 1.0,
                       "eval/num_turns": 1.0, "eval/failed": 0.0}
    samples = [json.loads(line) for line in (tmp_path / "eval" / "samples.jsonl").read_text().splitlines()]
    assert sorted(s["question"] for s in samples) == sorted(row["question"] for row in EVAL)
    assert all(s["score"] == RIGHT and s["gold_answer"] == GOLD[s["question"]] for s in samples)
    assert len(server.requests) == 2 and all(r["temperature"] == 0.0 for r in server.requests)


def test_the_shipped_yaml_and_env_args() -> None:
    settings = resolve_settings(verifiers_server.VerifiersEnv,
                                ["serve", "--config", str(ROOT / "environments" / "configs" / "verifiers.yaml")])
    config = settings.env_config
    assert (config.vf_env_name, config.get_env_args(), config.group_size, config.wandb_name) == (
        "primeintellect/gsm8k", {}, 8, "verifiers")
    assert settings.server_configs[0].base_url == "http://localhost:9001/v1"
    flags = resolve_settings(verifiers_server.VerifiersEnv, ["process", "--env.env_args", '{"use_think": false}'])
    assert flags.env_config.get_env_args() == {"use_think": False}
    with pytest.raises(ConfigError, match="env_args must be a JSON object"):
        resolve_settings(verifiers_server.VerifiersEnv, ["process", "--env.env_args", "[1, 2]"])
    assert verifiers_server.module_of("owner/my-env@1.2") == ("owner/my-env", "my_env")


def test_tool_calls_reach_verifiers_as_openai_models() -> None:
    """A managed session with a tool parser returns tool calls as dicts; verifiers model_dump()s them."""
    from openai.types.chat import ChatCompletion, ChatCompletionMessage
    from openai.types.chat.chat_completion import Choice

    message = ChatCompletionMessage(role="assistant", content="")
    call = {"id": "call_0", "type": "function", "function": {"name": "add", "arguments": '{"a": 2}'}}
    message.tool_calls = [call]  # type: ignore[list-item]  (as ManagedServer assigns them)
    response = ChatCompletion(id="x", object="chat.completion", created=0, model="m",
                              choices=[Choice(index=0, finish_reason="tool_calls", message=message)])
    (typed,) = verifiers_server.typed_tool_calls(response).choices[0].message.tool_calls
    assert typed.model_dump() == call


def test_loading_keeps_atroposlibs_signal_handlers(tiny_env: None) -> None:
    """verifiers environments install their own SIGINT/SIGTERM handlers when built."""
    before = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    environment = verifiers_server.load_vf_environment(ENV_ID, {"multi_turn": True})
    assert isinstance(environment, vf.MultiTurnEnv)
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == before


def _one_line_failure(capsys: pytest.CaptureFixture[str], tmp_path: Path, *flags: str) -> str:
    capsys.readouterr()
    with pytest.raises(AssertionError, match="exited with 1"):
        run_cli(SCRIPT, "process", "--env.use_wandb", "false", "--env.data_path_to_save_groups",
                str(tmp_path / "groups.jsonl"), *flags)
    err = capsys.readouterr().err
    assert "Traceback" not in err and not (tmp_path / "groups.jsonl").exists()
    return err.strip().splitlines()[-1]


def test_errors_are_one_line(tiny_env: None, capsys: pytest.CaptureFixture[str], tmp_path: Path,
                             monkeypatch: pytest.MonkeyPatch) -> None:
    assert _one_line_failure(capsys, tmp_path, "--env.vf_env_name", "someone/no-such-env") == (
        "verifiers_server.py: verifiers environment 'someone/no-such-env' is not installed (no module "
        "'no_such_env'); install it, e.g. prime env install someone/no-such-env")
    assert _one_line_failure(capsys, tmp_path, "--env.vf_env_name", ENV_ID, "--env.env_args", '{"colour": 1}') == (
        f"verifiers_server.py: cannot load verifiers environment '{ENV_ID}': load_environment() got an unexpected "
        "keyword argument 'colour'")
    assert _one_line_failure(capsys, tmp_path).startswith("verifiers_server.py: --env.vf_env_name is not set")
    monkeypatch.setitem(sys.modules, "verifiers", None)  # as if the extra were not installed
    line = _one_line_failure(capsys, tmp_path, "--env.vf_env_name", ENV_ID)
    assert line.startswith("verifiers_server.py: VerifiersEnv needs the verifiers package")
    assert line.endswith("pip install 'atroposlib[verifiers]'")
