"""Check mode (`atroposlib.envs.check`): the README's minimal environment and small_sums pass every
check against the built-in stand-in; environments broken on purpose (a mask off by one, a prompt
left unmasked, a constant reward, a short group, logprobs one short or shifted, a NaN score, no
messages, a wrong policy version, a failing evaluate or collect, a config that does not survive
YAML, scores outside the declared range) each fail with their line and exit 1;
``atropos-check-env`` runs as the README shows it."""

from __future__ import annotations

import os
import re
import runpy
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any, Optional

import pytest
from pydantic import field_validator

from transformers import AutoTokenizer

from atroposlib.envs.check_rules import Check, Collected, prompt_masked
from atroposlib.envs.runner import main
from atroposlib.envs.server_handling.stand_in import WRONG_ANSWER, answers_for
from tests.doc_blocks import doc_blocks
from tests.doc_commands import command_line, readme_arguments
from tests.environments.scripted_inference import ScriptedInference

ROOT = Path(__file__).resolve().parents[2]
MINIMAL = runpy.run_path(str(ROOT / "docs" / "examples" / "minimal_env.py"))
AdditionEnv, AdditionConfig = MINIMAL["AdditionEnv"], MINIMAL["AdditionConfig"]


def run_check(env_cls: Any, capsys: pytest.CaptureFixture[str], *flags: str) -> tuple[int, list[str]]:
    """``python env.py check FLAGS`` for `env_cls`, in this process: (exit status, report lines)."""
    with pytest.raises(SystemExit) as ended:
        main(env_cls, ["check", *flags])
    return ended.value.code, capsys.readouterr().out.splitlines()


def failed(lines: list[str]) -> list[str]:
    return [line for line in lines if line.startswith("FAIL")]


@pytest.fixture(autouse=True)
def _offline(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("WANDB_MODE", "disabled")


def test_the_minimal_environment_passes_every_check(tokenizer_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    status, lines = run_check(AdditionEnv, capsys, "--env.tokenizer_name", str(tokenizer_dir))
    assert status == 0, "\n".join(lines)
    assert lines[0].startswith("checking AdditionEnv on 4 groups against the built-in stand-in server")
    assert lines[-1] == "all 13 checks passed"
    assert len([line for line in lines if line.startswith("PASS  ")]) == 13 and not failed(lines), lines
    assert "PASS  scores vary within groups (4 of 4 groups vary)" in lines
    assert "PASS  prompt masked, completion trained (prompt located in 16 of 16 rollouts)" in lines


def test_small_sums_passes_every_check(tokenizer_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    sys.path.insert(0, str(ROOT / "environments"))
    try:
        env_cls = runpy.run_path(str(ROOT / "environments" / "small_sums_env.py"))["SmallSumsEnv"]
    finally:
        sys.path.remove(str(ROOT / "environments"))
    status, lines = run_check(env_cls, capsys, "--env.tokenizer_name", str(tokenizer_dir), "--groups", "2")
    assert status == 0 and lines[-1] == "all 13 checks passed", "\n".join(lines)


def _shown(line: str) -> str:
    """A report line without its details, which depend on the tokenizer and the machine."""
    return line.split(" (")[0]


def test_the_readmes_check_command_prints_what_its_output_block_shows(tokenizer_dir: Path,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    words = shlex.split(command_line("README.md", "check-env", "python docs/examples/minimal_env.py check"))
    status, lines = run_check(AdditionEnv, capsys, *[str(tokenizer_dir) if w == "$MODEL" else w for w in words[3:]])
    blocks = doc_blocks("README.md")
    command_block = next(i for i, block in enumerate(blocks) if block.kind == "id" and block.argument == "check-env")
    shown = blocks[command_block + 1]
    assert shown.kind == "output" and status == 0
    assert [_shown(line) for line in lines] == [_shown(line) for line in shown.text.splitlines()]


# -- environments broken on purpose -------------------------------------------------------------

def _first_trained(mask: list[int]) -> int:
    return next(i for i, label in enumerate(mask) if label != -100)


class MaskOffByOne(AdditionEnv):
    """Trains the last prompt token (the mask starts one position early)."""

    async def collect_trajectories(self, item: Any) -> tuple[Any, list[Any]]:
        group, backlog = await super().collect_trajectories(item)
        for tokens, mask in zip(group["tokens"], group["masks"]):
            start = _first_trained(mask)
            mask[start - 1] = tokens[start - 1]
        return group, backlog


class MaskOneLate(AdditionEnv):
    """Masks the first completion token too."""

    async def collect_trajectories(self, item: Any) -> tuple[Any, list[Any]]:
        group, backlog = await super().collect_trajectories(item)
        for mask in group["masks"]:
            mask[_first_trained(mask)] = -100
        return group, backlog


class PromptNotMasked(AdditionEnv):
    async def collect_trajectories(self, item: Any) -> tuple[Any, list[Any]]:
        group, backlog = await super().collect_trajectories(item)
        group["masks"] = [list(tokens) for tokens in group["tokens"]]
        return group, backlog


class ConstantReward(AdditionEnv):
    async def collect_trajectories(self, item: Any) -> tuple[Any, list[Any]]:
        group, backlog = await super().collect_trajectories(item)
        group["scores"] = [1.0] * len(group["scores"])
        return group, backlog


class OneRolloutShort(AdditionEnv):
    async def collect_trajectories(self, item: Any) -> tuple[Any, list[Any]]:
        group, backlog = await super().collect_trajectories(item)
        return {key: value[:-1] for key, value in group.items()}, backlog


class LogprobsOneShort(AdditionEnv):
    async def collect_trajectories(self, item: Any) -> tuple[Any, list[Any]]:
        group, backlog = await super().collect_trajectories(item)
        group["inference_logprobs"] = [logprobs[1:] for logprobs in group["inference_logprobs"]]
        return group, backlog


class LogprobsShifted(AdditionEnv):
    """Logprobs one position late: the first answer token gets the prompt's placeholder 1.0."""

    async def collect_trajectories(self, item: Any) -> tuple[Any, list[Any]]:
        group, backlog = await super().collect_trajectories(item)
        group["inference_logprobs"] = [[1.0, *logprobs[:-1]] for logprobs in group["inference_logprobs"]]
        return group, backlog


class NanScore(AdditionEnv):
    async def collect_trajectories(self, item: Any) -> tuple[Any, list[Any]]:
        group, backlog = await super().collect_trajectories(item)
        group["scores"][0] = float("nan")
        return group, backlog


class NoMessages(AdditionEnv):
    async def collect_trajectories(self, item: Any) -> tuple[Any, list[Any]]:
        group, backlog = await super().collect_trajectories(item)
        del group["messages"]
        return group, backlog


class OwnPolicyVersion(AdditionEnv):
    """Says its rollouts came from policy version 3 (the server sampled them at 7)."""

    async def collect_trajectories(self, item: Any) -> tuple[Any, list[Any]]:
        group, backlog = await super().collect_trajectories(item)
        group["generation_params"] = {"policy_version": 3}
        return group, backlog


class EvaluateFails(AdditionEnv):
    async def evaluate(self, *args: Any, **kwargs: Any) -> None:
        raise KeyError("eval/percent_correct")


class PrefixedConfig(AdditionConfig):
    prefix: str = "Q: "

    @field_validator("prefix")
    @classmethod
    def _doubled(cls, value: str) -> str:  # not idempotent: every read adds a space
        return value + " "


class ConfigChangesOnReading(AdditionEnv):
    env_config_cls = PrefixedConfig

    @classmethod
    def config_init(cls) -> tuple[Any, Any]:
        config, servers = AdditionEnv.config_init()
        return PrefixedConfig(**config.model_dump(exclude={"prefix"})), servers


class CollectRaises(AdditionEnv):
    async def collect_trajectories(self, item: Any) -> tuple[Any, list[Any]]:
        raise RuntimeError("no scorer for this item")


class ScoresAboveRange(AdditionEnv):
    score_range = (-1.0, 0.5)


BROKEN = [
    (MaskOffByOne, "FAIL  prompt masked, completion trained: group 1, rollout 1 trains position "),
    (MaskOneLate, "FAIL  prompt masked, completion trained: group 1, rollout 1 masks the first completion token"),
    (PromptNotMasked, "FAIL  prompt masked, completion trained: group 1, rollout 1 trains position 0 of the "),
    (ConstantReward, "FAIL  scores vary within groups: every group scored all alike ([1.0])"),
    (OneRolloutShort, "FAIL  group size: group 1 holds 3 rollouts, group_size is 4"),
    (LogprobsOneShort, "FAIL  tokens, masks and logprobs aligned: group 1: inference_logprobs.0: "),
    (LogprobsShifted, "FAIL  logprobs of trained tokens: group 1, rollout 1, position "),
    (NanScore, "FAIL  scores finite: group 1 has score nan"),
    (NoMessages, "FAIL  messages present and renderable: group 1 has no messages"),
    (OwnPolicyVersion, "FAIL  sampling parameters and policy version stamped: group 1, rollout 1 says "
                       "policy_version=3, sampled with 7"),
    (EvaluateFails, "FAIL  evaluate runs: KeyError: 'eval/percent_correct'"),
    (ConfigChangesOnReading, "FAIL  config round-trips through YAML: prefix was 'Q:  '"),
    (CollectRaises, "FAIL  groups collected: raised 6 times, first RuntimeError: no scorer for this item"),
    (ScoresAboveRange, "FAIL  scores finite and within [-1.0, 0.5]: group 1 has score 1.0"),
]


@pytest.mark.parametrize("env_cls, line", BROKEN, ids=[env.__name__ for env, _ in BROKEN])
def test_a_broken_environment_fails_with_its_line(env_cls: Any, line: str, tokenizer_dir: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    status, lines = run_check(env_cls, capsys, "--env.tokenizer_name", str(tokenizer_dir), "--groups", "2")
    assert status == 1
    assert [failure for failure in failed(lines) if failure.startswith(line)], "\n".join(lines)
    assert all(" — " in failure for failure in failed(lines)), "every failure says what to change"
    assert lines[-1].endswith("checks failed")


def test_a_registration_the_api_refuses_fails(tokenizer_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    status, lines = run_check(AdditionEnv, capsys, "--env.tokenizer_name", str(tokenizer_dir), "--env.group_size", "0",
                              "--groups", "1")
    assert status == 1
    assert "FAIL  registration fields the API needs: group_size: Input should be greater than or equal to 1" in \
        "\n".join(lines)


@pytest.mark.parametrize("mode, flags, message", [
    ("check", ["--groups", "0"], "--groups must be at least 1"),
    ("process", ["--groups", "2"], "unknown option --groups"),  # a flag of check mode only
])
def test_bad_flags_exit_2_in_one_line(mode: str, flags: list[str], message: str,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as ended:
        main(AdditionEnv, [mode, *flags])
    err = capsys.readouterr().err
    assert ended.value.code == 2 and message in err and len(err.strip().splitlines()) == 1


def test_a_real_server_that_does_not_answer_is_one_line(tokenizer_dir: Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    status, lines = run_check(AdditionEnv, capsys, "--env.tokenizer_name", str(tokenizer_dir),
                              "--openai.base_url", "http://127.0.0.1:9/v1")
    assert status == 1
    assert lines[0] == "checking AdditionEnv on 4 groups against http://127.0.0.1:9/v1"
    assert failed(lines) == ["FAIL  inference server answers: none at http://127.0.0.1:9/v1 — start one, correct "
                             "--openai.base_url, or leave it out to use the stand-in"]


def boxed_sum_half_right(prompt: str, index: int) -> str:
    """Even choices answer right in \\boxed{}, odd ones one off."""
    a, b = map(int, re.findall(r"What is (\d+) \+ (\d+)\?", prompt)[-1])
    return f"\\boxed{{{a + b + index % 2}}}"


def test_a_real_server_is_checked_when_its_url_is_given(tokenizer_dir: Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    with ScriptedInference(boxed_sum_half_right, tokenizer) as server:
        server.policy_version = 5
        status, lines = run_check(AdditionEnv, capsys, "--env.tokenizer_name", str(tokenizer_dir), "--groups", "2",
                                  "--openai.base_url", f"{server.url}/v1", "--openai.model_name", "scripted")
    assert lines[0] == f"checking AdditionEnv on 2 groups against {server.url}/v1"
    assert status == 0 and lines[-1] == "all 13 checks passed", "\n".join(lines)
    assert any(request.get("prompt", {}).get("prompt_token_ids") for request in server.requests)  # vLLM's /generate


# -- the rules and the stand-in, directly ----------------------------------------------------------

def test_the_stand_in_answers_with_the_items_answer_first_and_a_wrong_one_second() -> None:
    answers = answers_for({"question": "What is 12 + 30? " * 5, "answer": 42})
    assert "\\boxed{42}" in answers[0] and answers[1] == WRONG_ANSWER
    assert "\\boxed{42}" in answers[2]
    small = answers_for({"a": 3, "b": 4})  # no answer key: the numbers and their sums
    assert any(answer.endswith("\\boxed{7}") for answer in small[:4])


def test_a_prompt_is_located_by_its_tokens_and_the_shortest_wins() -> None:
    group = {"tokens": [[5, 6, 7, 8, 9]], "masks": [[-100, -100, 7, 8, 9]], "scores": [1.0]}
    located = prompt_masked([Collected(group, prompts=[[5, 6, 7, 8], [5, 6]])])
    assert located == Check(name="prompt masked, completion trained", passed=True,
                            detail="prompt located in 1 of 1 rollouts")
    unknown = prompt_masked([Collected(group, prompts=[[1, 2]])])
    assert unknown.passed and "could not be located" in unknown.detail


# -- atropos-check-env ------------------------------------------------------------------------------

def test_atropos_check_env_runs_as_the_readme_shows(tokenizer_dir: Path) -> None:
    words = readme_arguments("console-tools", "atropos-check-env", MODEL=str(tokenizer_dir))
    program = Path(sys.executable).parent / "atropos-check-env"
    done = subprocess.run([str(program), *words], cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "HF_HUB_OFFLINE": "1", "WANDB_MODE": "disabled"})
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    assert done.stdout.splitlines()[-1] == "all 13 checks passed"


def _check_env(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[Optional[int], str, str]:
    from atroposlib.cli.check_env import main as check_env

    saved = sys.argv[:], sys.path[:]
    try:
        with pytest.raises(SystemExit) as ended:
            check_env(args)
    finally:
        sys.argv, sys.path[:] = saved
    captured = capsys.readouterr()
    return ended.value.code, captured.out, captured.err


def test_atropos_check_env_finds_the_class_a_file_defines(tmp_path: Path, tokenizer_dir: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    broken = tmp_path / "constant_env.py"
    broken.write_text(f"import sys\nsys.path.insert(0, {str(ROOT / 'docs' / 'examples')!r})\n"
                      "from minimal_env import AdditionEnv\n\n\n"
                      "class ConstantEnv(AdditionEnv):\n"
                      "    async def collect_trajectories(self, item):\n"
                      "        group, backlog = await super().collect_trajectories(item)\n"
                      "        group['scores'] = [0.0] * len(group['scores'])\n"
                      "        return group, backlog\n")
    status, out, _ = _check_env([str(broken), "--env.tokenizer_name", str(tokenizer_dir), "--groups", "1"], capsys)
    assert status == 1 and out.startswith("checking ConstantEnv on 1 groups")
    assert "FAIL  scores vary within groups: every group scored all alike ([0.0])" in out


@pytest.mark.parametrize("content, message", [
    (None, "no such file"),
    ("x = 1\n", "defines no BaseEnv subclass"),
    ("import not_a_module_anywhere\n", "cannot load"),
])
def test_atropos_check_env_refuses_an_unusable_file_in_one_line(content: Optional[str], message: str, tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "env.py"
    if content is not None:
        path.write_text(content)
    status, _, err = _check_env([str(path)], capsys)
    assert status == 2 and message in err and len(err.strip().splitlines()) == 1
