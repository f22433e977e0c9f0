"""letter_counting_environment: scoring of right, wrong and badly formatted answers, groups outside
the difficulty band dropped, the level moving with the success rate, and evaluation on a local file."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Callable

import pytest
from transformers import AutoTokenizer

from tests.environments.harness import ROOT, process_groups, run_cli
from tests.environments.scripted_inference import ScriptedInference

SCRIPT = "letter_counting_environment/letter_counting_environment.py"
WORDS = ROOT / "environments" / "letter_counting_environment" / "words.txt"
EVAL_FIXTURE = ROOT / "environments" / "fixtures" / "letter_counting" / "eval.jsonl"
COMMON = ("--env.word_list_file", str(WORDS), "--env.test_file", str(EVAL_FIXTURE), "--env.debug_logging", "false")


def question(prompt: str) -> tuple[str, list[str]]:
    """The text and the letters a prompt asks about."""
    text = re.search(r'string "([a-z]+)"', prompt).group(1)
    letters = re.findall(r"'([a-z])'", prompt.split('string "')[0])
    return text, letters


def reply(prompt: str, kind: str) -> str:
    """A reply of `kind`: right, wrong (a count off by one), no_think (right count, no think block)."""
    text, letters = question(prompt)
    counts = {c: text.count(c) + (1 if kind == "wrong" else 0) for c in letters}
    answer = str(counts[letters[0]]) if len(letters) == 1 else json.dumps(counts)
    think = "" if kind == "no_think" else "<think>Going through the string letter by letter.</think>"
    return f"{think}\nSo the answer is <answer>{answer}</answer>"


KINDS = ["right", "wrong", "right", "no_think"]


@pytest.fixture(scope="module")
def tokenizer(tokenizer_dir: Path):
    return AutoTokenizer.from_pretrained(str(tokenizer_dir))


def run(tmp_path: Path, tokenizer_dir: Path, tokenizer, answer: Callable[[str, int], str], *flags: str, steps: int = 2):
    with ScriptedInference(answer, tokenizer) as server:
        groups = process_groups(SCRIPT, tmp_path, server.url, tokenizer_dir, *COMMON, *flags,
                                steps=steps, group_size=4, server_type="vllm")
    return groups, server.requests


def test_right_answers_score_one_wrong_and_unformatted_zero(tmp_path, tokenizer_dir, tokenizer):
    groups, _ = run(tmp_path, tokenizer_dir, tokenizer, lambda prompt, i: reply(prompt, KINDS[i % 4]),
                    "--env.starting_difficulty_level", "4", steps=3)
    assert len(groups) == 3
    saw_multi = False
    for group in groups:
        assert sorted(group["scores"]) == [0.0, 0.0, 1.0, 1.0]
        for messages, score, logprobs, mask in zip(group["messages"], group["scores"], group["inference_logprobs"],
                                                   group["masks"]):
            prompt, answer = messages[0]["content"], messages[-1]["content"]
            assert score == (1.0 if answer == reply(prompt, "right") else 0.0)
            assert len(logprobs) == len(mask)
            saw_multi |= len(question(prompt)[1]) > 1
    # level 4 asks for several letters 80 % of the time: the JSON answers were scored too
    assert saw_multi


def test_groups_outside_the_band_are_dropped_and_the_level_rises(tmp_path, tokenizer_dir, tokenizer):
    """Four all-right groups at level 5 (dropped: too easy; window 4) lift the level to 6 (random strings)."""
    asked: list[str] = []

    def answer(prompt: str, index: int) -> str:
        if index == 0:
            asked.append(question(prompt)[0])
        return reply(prompt, "right" if len(asked) <= 4 else KINDS[index % 4])

    groups, _ = run(tmp_path, tokenizer_dir, tokenizer, answer, "--env.starting_difficulty_level", "5",
                    "--env.difficulty_window_size", "4", "--env.process_concurrency", "1")
    assert len(groups) == 2
    assert len(asked) == 6
    assert all(len(text) <= 35 for text in asked[:4])  # level 5: words of 15-35 letters
    written = [question(group["messages"][0][0]["content"])[0] for group in groups]
    assert written == asked[4:] and all(40 <= len(text) <= 80 for text in written)  # level 6


def test_all_wrong_groups_are_dropped_and_the_level_falls(tmp_path, tokenizer_dir, tokenizer):
    """Four all-wrong groups at level 6 (dropped: too hard; window 4) bring the level down to 5 (words)."""
    asked: list[str] = []

    def answer(prompt: str, index: int) -> str:
        if index == 0:
            asked.append(question(prompt)[0])
        return reply(prompt, "wrong" if len(asked) <= 4 else KINDS[index % 4])

    groups, _ = run(tmp_path, tokenizer_dir, tokenizer, answer, "--env.starting_difficulty_level", "6",
                    "--env.difficulty_window_size", "4", "--env.process_concurrency", "1", steps=1)
    assert len(groups) == 1
    assert all(len(text) >= 40 for text in asked[:4])
    assert len(asked[4]) <= 35


def test_evaluate_on_the_local_eval_file(tmp_path, tokenizer_dir, tokenizer):
    rows = [json.loads(line) for line in EVAL_FIXTURE.read_text().splitlines()]

    def answer(prompt: str, index: int) -> str:
        return reply(prompt, "right" if len(question(prompt)[0]) % 2 == 0 else "wrong")

    expected = sum(len(row["_text"]) % 2 == 0 for row in rows) / len(rows)
    with ScriptedInference(answer, tokenizer) as server:
        run_cli(SCRIPT, "evaluate", *COMMON, "--env.tokenizer_name", str(tokenizer_dir),
                "--openai.base_url", f"{server.url}/v1", "--openai.model_name", "scripted", "--openai.api_key", "x",
                "--env.use_wandb", "false", "--env.data_dir_to_save_evals", str(tmp_path / "eval"))
    metrics = json.loads((tmp_path / "eval" / "metrics.json").read_text())["results"]["all"]
    assert metrics["eval/percent_correct"] == pytest.approx(expected)
    assert 0 < expected < 1
    for level in range(1, 11):
        assert f"eval/percent_correct_L{level}" in metrics
    samples = [json.loads(line) for line in (tmp_path / "eval" / "samples.jsonl").read_text().splitlines()]
    assert len(samples) == len(rows)


def test_config_init_reads_config_yaml(monkeypatch, tmp_path):
    import importlib.util

    spec = importlib.util.spec_from_file_location("letter_counting_under_test", ROOT / "environments" / SCRIPT)
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)
    spec.loader.exec_module(module)
    monkeypatch.chdir(tmp_path)  # no config.yaml here: Atropos's built-in defaults
    monkeypatch.setattr("sys.argv", ["letter_counting_environment.py", "serve"])
    env_config, servers = module.LetterCountingEnv.config_init()
    assert (env_config.group_size, env_config.max_token_length, env_config.starting_difficulty_level) == (16, 16864, 3)
    assert servers[0].base_url == "http://localhost:8001/v1"
    config_yaml = ROOT / "environments" / "letter_counting_environment" / "config.yaml"
    monkeypatch.setattr("sys.argv", ["letter_counting_environment.py", "serve", "--config", str(config_yaml)])
    env_config, servers = module.LetterCountingEnv.config_init()
    assert (env_config.group_size, env_config.max_token_length, env_config.starting_difficulty_level) == (8, 8192, 4)
    assert (env_config.tokenizer_name, env_config.worker_timeout, env_config.steps_per_eval) == ("Qwen/Qwen3-8B", 3600, 5)
    assert (servers[0].model_name, servers[0].num_requests_for_eval) == ("Qwen/Qwen3-8B", 256)
