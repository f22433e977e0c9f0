"""reasoning_gym_environment: the task's scorer on the <answer> after the thinking, format failures,
truncated rollouts, the length penalty, the curriculum, and evaluation on a local file."""

from __future__ import annotations

import asyncio
import json
import re
import time
from pathlib import Path

import pytest
from transformers import AutoTokenizer

pytest.importorskip("reasoning_gym", reason="the reasoning-gym package (quickstart extra)")

from tests.environments.harness import ROOT, process_groups, run_cli  # noqa: E402
from tests.environments.scripted_inference import ScriptedInference  # noqa: E402

SCRIPT = "reasoning_gym_environment/reasoning_gym_environment.py"
FIXTURE = ROOT / "environments" / "fixtures" / "reasoning_gym" / "test.jsonl"
COMMON = ("--env.tasks", "chain_sum", "--env.test_file", str(FIXTURE))


@pytest.fixture(scope="module")
def tokenizer(tokenizer_dir: Path):
    return AutoTokenizer.from_pretrained(str(tokenizer_dir))


def chain_sum(prompt: str) -> int:
    expression = re.search(r"arithmetic problem: ([-+ 0-9]+)=", prompt).group(1)
    return sum(int(term) for term in re.findall(r"[-+]?\s*\d+", expression.replace(" ", "")))


REPLIES = {
    "right": lambda a: f"<think>Adding the terms one by one.</think>\nThe total is <answer>{a}</answer>.",
    "wrong": lambda a: f"<think>Adding the terms one by one.</think>\n<answer>{a + 1}</answer>",
    "only_in_thinking": lambda a: f"<think>It is <answer>{a}</answer>, I think.</think>\nDone.",
    "two_answers": lambda a: f"<think>Adding.</think><answer>{a}</answer> or maybe <answer>{a + 1}</answer>",
}
ORDER = ["right", "wrong", "only_in_thinking", "two_answers"]


def run(tmp_path, tokenizer_dir, tokenizer, answer, *flags, steps=2, finish_reason="stop"):
    with ScriptedInference(answer, tokenizer, finish_reason=finish_reason) as server:
        return process_groups(SCRIPT, tmp_path, server.url, tokenizer_dir, *COMMON, *flags, steps=steps, group_size=4)


def test_the_task_scorer_judges_the_answer_after_thinking(tmp_path, tokenizer_dir, tokenizer):
    groups = run(tmp_path, tokenizer_dir, tokenizer, lambda prompt, i: REPLIES[ORDER[i % 4]](chain_sum(prompt)),
                 steps=3)
    assert len(groups) == 3
    for group in groups:
        for messages, score, override in zip(group["messages"], group["scores"], group["overrides"]):
            total = chain_sum(messages[1]["content"])
            kind = next(k for k in ORDER if REPLIES[k](total) == messages[-1]["content"])
            assert score == (1.0 if kind == "right" else 0.0), kind
            assert override == {}
        assert sorted(group["scores"]) == [0.0, 0.0, 0.0, 1.0]


def test_rollouts_cut_off_by_the_length_limit_get_no_advantage(tmp_path, tokenizer_dir, tokenizer):
    groups = run(tmp_path, tokenizer_dir, tokenizer, lambda prompt, i: REPLIES[ORDER[i % 2]](chain_sum(prompt)),
                 steps=1, finish_reason="length")
    assert len(groups) == 1
    assert groups[0]["overrides"] == [{"set_advantage_to_zero": True}] * 4
    groups = run(tmp_path / "kept", tokenizer_dir, tokenizer,
                 lambda prompt, i: REPLIES[ORDER[i % 2]](chain_sum(prompt)), "--env.mask_too_long_completions",
                 "false", steps=1, finish_reason="length")
    assert groups[0]["overrides"] == [{}] * 4


def test_length_penalty_when_every_answer_is_right(tmp_path, tokenizer_dir, tokenizer):
    padding = ["", " and so on" * 10, " and so on" * 25, " and so on" * 40]
    max_length = 700

    def answer(prompt: str, index: int) -> str:
        return f"<think>Adding{padding[index % 4]}.</think><answer>{chain_sum(prompt)}</answer>"

    groups = run(tmp_path, tokenizer_dir, tokenizer, answer, "--env.max_token_length", str(max_length), steps=1)
    assert len(groups) == 1
    start = 0.75 * max_length
    expected = [1.0 if len(t) <= start else 1.0 - min(1.0, (len(t) - start) / (max_length - start))
                for t in groups[0]["tokens"]]
    assert groups[0]["scores"] == pytest.approx(expected)
    assert min(expected) < 1.0 == max(expected)  # some were penalised, some not


def test_curriculum_steers_each_task_towards_the_target(tokenizer_dir):
    import importlib.util
    import sys

    from atroposlib.envs.base import APIServerConfig

    spec = importlib.util.spec_from_file_location("reasoning_gym_env_under_test", ROOT / "environments" / SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    try:
        spec.loader.exec_module(module)
        config = module.ReasoningGymEnvConfig(tokenizer_name=str(tokenizer_dir), complexity_mode="curriculum",
                                              tasks="chain_sum", use_wandb=False)
        env = module.ReasoningGymEnv(config, [APIServerConfig(model_name="m", base_url="http://127.0.0.1:9/v1")],
                                     slurm=False)
        env.task_names = ["chain_sum"]
        env._initialize_complexity_mapping()
        assert env.task_complexity_levels["chain_sum"] == 0.3
        for _ in range(3):  # consistently right: harder, with a quick jump while still easy
            env._update_task_performance("chain_sum", 1.0)
        assert env.task_complexity_levels["chain_sum"] == pytest.approx(0.3 + 0.1)
        for _ in range(5):  # consistently wrong: easier again
            env._update_task_performance("chain_sum", 0.0)
        assert env.task_complexity_levels["chain_sum"] < 0.4
        # the difficulty picks the task's reasoning-gym curriculum level
        env.task_complexity_levels["chain_sum"] = 0.0
        easy = env._create_dataset_with_complexity("chain_sum", 1).config
        env.task_complexity_levels["chain_sum"] = 1.0
        hard = env._create_dataset_with_complexity("chain_sum", 1).config
        assert (easy.max_terms, easy.max_digits) == (2, 1)
        assert hard.max_terms > easy.max_terms and hard.max_digits > easy.max_digits
        # a level too slow to generate: default settings for this item, and the task is capped below it
        real_build = env._build_dataset

        def slow_build(task, level, seed):
            if level is not None:
                time.sleep(1.0)
            return real_build(task, level, seed)

        env._build_dataset = slow_build
        module.GENERATION_TIME_LIMIT = 0.1
        top = module.rg_factory.create_curriculum("chain_sum").attributes["num_terms"].levels
        dataset, entry = asyncio.run(env._generate("chain_sum", 3))
        assert dataset.config.max_terms == module.reasoning_gym.create_dataset("chain_sum", size=1, seed=3).config.max_terms
        assert entry["metadata"]["source_dataset"] == "chain_sum"
        assert env.task_level_caps["chain_sum"] == len(top) - 2
    finally:
        sys.modules.pop(spec.name, None)


def test_evaluate_on_the_local_test_file(tmp_path, tokenizer_dir, tokenizer):
    rows = [json.loads(line) for line in FIXTURE.read_text().splitlines()]

    def answer(prompt: str, index: int) -> str:
        row = next(r for r in rows if r["question"].strip() in prompt)
        gold = int(row["answer"])
        right = row["metadata"]["source_dataset"] != "basic_arithmetic"
        return f"<think>...</think><answer>{gold if right else gold + 7}</answer>"

    with ScriptedInference(answer, tokenizer) as server:  # training tasks: all of reasoning-gym's
        run_cli(SCRIPT, "evaluate", "--env.test_file", str(FIXTURE), "--env.tokenizer_name", str(tokenizer_dir),
                "--openai.base_url",
                f"{server.url}/v1", "--openai.model_name", "scripted", "--openai.api_key", "x",
                "--env.use_wandb", "false", "--env.data_dir_to_save_evals", str(tmp_path / "eval"))
    metrics = json.loads((tmp_path / "eval" / "metrics.json").read_text())["results"]["all"]
    assert metrics["eval/percent_correct"] == pytest.approx(6 / 9)
    samples = [json.loads(line) for line in (tmp_path / "eval" / "samples.jsonl").read_text().splitlines()]
    assert sorted(s["task_name"] for s in samples if s["correct"]) == ["chain_sum"] * 3 + ["leg_counting"] * 3


def test_evaluate_generates_problems_when_the_hub_is_out_of_reach(tmp_path, tokenizer_dir, tokenizer):
    def answer(prompt: str, index: int) -> str:
        return REPLIES["right" if chain_sum(prompt) % 2 else "wrong"](chain_sum(prompt))

    with ScriptedInference(answer, tokenizer) as server:  # HF_DATASETS_OFFLINE: the hub test split fails to load
        run_cli(SCRIPT, "evaluate", "--env.tasks", "chain_sum", "--env.num_eval_samples_per_task", "6",
                "--env.tokenizer_name", str(tokenizer_dir), "--openai.base_url", f"{server.url}/v1",
                "--openai.model_name", "scripted", "--openai.api_key", "x", "--env.use_wandb", "false",
                "--env.data_dir_to_save_evals", str(tmp_path / "eval"))
    samples = [json.loads(line) for line in (tmp_path / "eval" / "samples.jsonl").read_text().splitlines()]
    assert len(samples) == 6 and {s["task_name"] for s in samples} == {"chain_sum"}
    odd = sum(int(s["expected_answer"]) % 2 for s in samples)
    metrics = json.loads((tmp_path / "eval" / "metrics.json").read_text())["results"]["all"]
    assert metrics["eval/percent_correct"] == pytest.approx(odd / 6)
