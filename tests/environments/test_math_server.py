"""environments/math_server.py (MathEnv): math-verify scoring in process mode, and the
self-judging sub-tasks (length penalty, pairwise preference, judge, retry, selfcorrect)
played against the scripted vLLM-compatible server."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import sys
from pathlib import Path
from typing import Any

import pytest
from transformers import AutoTokenizer

from tests.environments.harness import ENVIRONMENTS, process_groups
from tests.environments.scripted_inference import ScriptedInference

FIXTURES = ENVIRONMENTS / "fixtures" / "math"
TRAIN = [json.loads(line) for line in (FIXTURES / "deepmath_train.jsonl").read_text().splitlines()]
GOLD = {row["question"]: row["final_answer"] for row in TRAIN}
EVAL = [json.loads(line) for line in (FIXTURES / "eval.jsonl").read_text().splitlines()]
EVAL_GOLD = {row["problem"]: row["answer"] for row in EVAL}
ALL_RIGHT = TRAIN[0]["question"]  # every rollout right: no learning signal


def problem_in(prompt: str) -> str:
    return next(q for q in [*GOLD, *EVAL_GOLD] if q in prompt)


def solution(problem: str, right: bool, long: bool = False) -> str:
    answer = {**GOLD, **EVAL_GOLD}[problem] if right else "98765"
    body = "Working it out term by term and checking each step twice, " * (6 if long else 1)
    return f"<think>Let me reason about this problem carefully.</think> {body}the result is \\boxed{{{answer}}}."


def normal_answers(prompt: str, index: int) -> str:
    problem = problem_in(prompt)
    if problem == ALL_RIGHT:
        return solution(problem, True)
    return solution(problem, index % 2 == 0)


@pytest.fixture(scope="module")
def tokenizer(tokenizer_dir: Path) -> Any:
    return AutoTokenizer.from_pretrained(str(tokenizer_dir))


def test_process_scores_right_answers_1_and_wrong_ones_minus_1(tokenizer_dir: Path, tokenizer: Any, tmp_path: Path) -> None:
    with ScriptedInference(normal_answers, tokenizer) as server:
        groups = process_groups(
            "math_server.py", tmp_path, server.url, tokenizer_dir, "--env.max_token_length", "4096",
            "--env.train_file", str(FIXTURES / "deepmath_train.jsonl"), "--env.test_file", str(FIXTURES / "eval.jsonl"),
            "--env.percent_length_penalty", "0", steps=3, group_size=4, server_type="vllm",
        )
    assert len(groups) == 3
    for group in groups:
        assert sorted(group["scores"]) == [-1.0, -1.0, 1.0, 1.0]
        for messages, score in zip(group["messages"], group["scores"]):
            assert ("98765" not in messages[-1]["content"]) == (score == 1.0)
        assert all(ALL_RIGHT not in messages[1]["content"] for messages in group["messages"])
        assert len(group["inference_logprobs"]) == 4 and group["overrides"] == [{}] * 4
        for tokens, masks, logprobs in zip(group["tokens"], group["masks"], group["inference_logprobs"]):
            assert len(tokens) == len(masks) == len(logprobs) and masks[0] == -100


def _load_math_module() -> Any:
    spec = importlib.util.spec_from_file_location("h1_math_server", ENVIRONMENTS / "math_server.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["h1_math_server"] = module  # the scoring worker pickles score_answer by module name
    spec.loader.exec_module(module)
    return module


def _env(module: Any, url: str, tokenizer_dir: Path, tmp_path: Path, **overrides: Any) -> Any:
    config = module.RSConfig(
        tokenizer_name=str(tokenizer_dir), group_size=4, max_token_length=4096, use_wandb=False,
        train_file=str(FIXTURES / "deepmath_train.jsonl"), test_file=str(FIXTURES / "eval.jsonl"),
        data_dir_to_save_evals=str(tmp_path / "evals"), **overrides,
    )
    server = module.APIServerConfig(model_name="scripted", base_url=f"{url}/v1", api_key="x", server_type="vllm",
                                    tokenizer_name=str(tokenizer_dir), health_check=False)
    return module.MathEnv(config, [server], slurm=False, testing=False)


def _between(prompt: str, start: str, end: str) -> str:
    return prompt.split(start, 1)[1].split(end, 1)[0]


def sub_task_answers(prompt: str, index: int) -> str:
    if "Solution 1:" in prompt:  # the preference vote: always the shorter solution
        first, second = _between(prompt, "Solution 1:", "Solution 2:"), _between(prompt, "Solution 2:", "Judge them")
        return f"<think>Comparing.</think> I prefer \\boxed{{{1 if len(first) < len(second) else 2}}}"
    if "Earlier attempt:" in prompt:  # retries after a review: two of four reach the answer
        return solution(problem_in(prompt), index < 2)
    if "Proposed solution:" in prompt:  # judging: even choices give the right verdict
        wrong_solution = "98765" in _between(prompt, "Proposed solution:", "Explain how")
        verdict = (not wrong_solution) == (index % 2 == 0)
        return f"<think>Checking the steps.</think> The review is done. \\boxed{{{verdict}}}"
    problem = problem_in(prompt)
    if problem == ALL_RIGHT:  # all right, answers of different lengths
        return solution(problem, True, long=index % 2 == 1)
    if problem in EVAL_GOLD:
        return solution(problem, "15%" not in problem)
    return solution(problem, index % 2 == 0)


def test_sub_tasks_length_penalty_preference_judge_retry_selfcorrect_and_eval(
        tokenizer_dir: Path, tokenizer: Any, tmp_path: Path) -> None:
    module = _load_math_module()

    async def play(env: Any) -> dict[str, Any]:
        await env.setup()
        seen: dict[str, Any] = {}
        all_right = {"kind": "normal", "problem": ALL_RIGHT, "gold": "\\boxed{400}"}
        seen["penalised"], backlog = await env.collect_trajectories(all_right)
        seen["rlaif_items"] = [b for b in backlog if b["kind"] == "rlaif"]
        seen["rlaif"], _ = await env.collect_trajectories(seen["rlaif_items"][0])
        mixed = {"kind": "normal", "problem": TRAIN[1]["question"], "gold": "\\boxed{24}"}
        seen["mixed"], seen["judge_items"] = await env.collect_trajectories(mixed)
        seen["judged"] = [await env.collect_trajectories(item) for item in seen["judge_items"]]
        selfcorrect = [b for _, backlog in seen["judged"] for b in backlog]
        seen["selfcorrect_items"] = selfcorrect
        seen["selfcorrect"], _ = await env.collect_trajectories(selfcorrect[0])
        await env.evaluate()
        await env.server.close()
        env._scoring_pool.shutdown()
        return seen

    with ScriptedInference(sub_task_answers, tokenizer) as server:
        env = _env(module, server.url, tokenizer_dir, tmp_path, percent_length_penalty=1.0, percent_to_judge=1.0)
        seen = asyncio.run(play(env))

    penalised = seen["penalised"]  # cosine length penalty: 1 for the shortest, -1 for the longest
    for tokens, score in zip(penalised["tokens"], penalised["scores"]):
        lengths = [len(t) for t in penalised["tokens"]]
        assert score == pytest.approx(1.0 if len(tokens) == min(lengths) else -1.0)

    rlaif = seen["rlaif"]  # the judge always preferred the shorter solution, in both orders
    assert rlaif["group_overrides"] == {"group_size": 2}
    short_first = len(rlaif["tokens"][0]) < len(rlaif["tokens"][1])
    assert rlaif["scores"] == ([1.0, -1.0] if short_first else [-1.0, 1.0])

    mixed = seen["mixed"]
    assert sorted(mixed["scores"]) == [-1.0, -1.0, 1.0, 1.0]
    assert [item["verdict"] for item in seen["judge_items"]] == ["True", "False"]
    assert "98765" not in seen["judge_items"][0]["solution"] and "98765" in seen["judge_items"][1]["solution"]

    (on_right, right_backlog), (on_wrong, wrong_backlog) = seen["judged"]
    assert on_right["scores"] == [1.0, -1.0, 1.0, -1.0] and right_backlog == []
    # a right verdict on a wrong solution scores the share of retries (2 of 4) that then succeed
    assert on_wrong["scores"] == [0.5, -1.0, 0.5, -1.0] and len(wrong_backlog) == 2
    assert seen["selfcorrect"]["scores"] == [1.0, 1.0, -1.0, -1.0]

    metrics = json.loads((tmp_path / "evals" / "metrics.json").read_text())
    results = json.dumps(metrics)
    assert "eval/amc23_percent_correct" in results and "eval/overall_percent_correct" in results
    assert dict(env.eval_metrics)["eval/overall_percent_correct"] == pytest.approx(0.75)
    assert dict(env.eval_metrics)["eval/amc23_percent_correct"] == 0.0
    assert dict(env.eval_metrics)["eval/math500_percent_correct"] == 1.0


def test_score_answer_is_math_verify_on_the_text_after_thinking() -> None:
    module = _load_math_module()
    assert module.score_answer("\\boxed{\\frac{1}{6}}", "so it is \\boxed{1/6}") is True
    assert module.score_answer("\\boxed{e^3}", "\\boxed{e^{3}}") is True
    assert module.score_answer("\\boxed{12}", "\\boxed{13}") is False
    assert module.score_answer("\\boxed{}", "anything") is None
    assert module.boxed_choice("<think>\\boxed{2}</think> final: \\boxed{1}") == "1"
    assert module.cosine_length_scores([100, 105]) is None
    assert module.cosine_length_scores([100, 150, 200]) == pytest.approx([1.0, 0.0, -1.0])
