"""environments/small_sums_env.py: scoring, the held-out split, managed rollouts with the
sampler's logprobs and sampling settings in process mode, and the held-out evaluation,
played against the scripted vLLM-compatible server."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from transformers import AutoTokenizer

from tests.environments.harness import ENVIRONMENTS, process_groups, run_cli
from tests.environments.scripted_inference import ScriptedInference

sys.path.insert(0, str(ENVIRONMENTS))
from small_sums_task import PROMPT, score, split_pairs  # noqa: E402

QUESTION = re.compile(r"What is (\d) \+ (\d)\?")


def half_right(prompt: str, index: int) -> str:
    """Even answers right ("a + b = c"), odd ones one off."""
    a, b = map(int, QUESTION.findall(prompt)[-1])
    return f"{a} + {b} = {a + b + index % 2}"


@pytest.fixture(scope="module")
def tokenizer(tokenizer_dir: Path) -> Any:
    return AutoTokenizer.from_pretrained(str(tokenizer_dir))


def test_the_last_number_is_the_answer() -> None:
    assert score("3 + 4 = 7", 7) == 1.0 and score("7", 7) == 1.0 and score("It is 7, not 8.", 7) == 0.0
    assert score("seven", 7) == 0.0 and score("", 7) == 0.0


@pytest.mark.parametrize("eval_pairs", [0, 1, 29, 30, 55, 100])
def test_the_held_out_pairs_are_fixed_and_never_trained_on_in_either_order(eval_pairs: int) -> None:
    train, held_out = split_pairs(eval_pairs, 1234)
    assert len(held_out) == eval_pairs and len(train) == 100 - eval_pairs
    assert not set(train) & {pair for a, b in held_out for pair in ((a, b), (b, a))}
    assert split_pairs(eval_pairs, 1234) == (train, held_out)


def test_another_split_seed_holds_out_other_pairs() -> None:
    assert set(split_pairs(30, 1234)[1]) != set(split_pairs(30, 7)[1])


def test_process_writes_managed_groups_with_logprobs_and_sampling_settings(
        tokenizer_dir: Path, tokenizer: Any, tmp_path: Path) -> None:
    with ScriptedInference(half_right, tokenizer) as server:
        server.policy_version = 4
        groups = process_groups("small_sums_env.py", tmp_path, server.url, tokenizer_dir, steps=2, group_size=4,
                                server_type="vllm")
    _, held_out = split_pairs(30, 1234)
    assert len(groups) == 2
    for group in groups:
        assert sorted(group["scores"]) == [0.0, 0.0, 1.0, 1.0]
        assert group["generation_params"] == {"temperature": 0.7, "policy_version": 4}
        question = group["messages"][0][0]["content"]
        a, b = map(int, QUESTION.findall(question)[0])
        assert question == PROMPT.format(a=a, b=b) and (a, b) not in held_out
        for tokens, masks, logprobs in zip(group["tokens"], group["masks"], group["inference_logprobs"]):
            assert len(tokens) == len(masks) == len(logprobs)
            trained = [i for i, mask in enumerate(masks) if mask != -100]
            assert trained and all(logprobs[i] <= 0 for i in trained)


def test_evaluate_scores_the_held_out_pairs_with_the_training_sampling(
        tokenizer_dir: Path, tokenizer: Any, tmp_path: Path) -> None:
    with ScriptedInference(half_right, tokenizer) as server:
        run_cli("small_sums_env.py", "evaluate", "--env.tokenizer_name", str(tokenizer_dir), "--env.use_wandb",
                "false", "--env.eval_samples", "2", "--env.data_dir_to_save_evals", str(tmp_path / "eval"),
                "--openai.base_url", f"{server.url}/v1", "--openai.model_name", "scripted",
                "--openai.server_type", "vllm", "--openai.tokenizer_name", str(tokenizer_dir))
    metrics = json.loads((tmp_path / "eval" / "metrics.json").read_text())["results"]["all"]
    assert metrics == {"eval/accuracy": 0.5, "eval/answers": 60}
    samples = [json.loads(line) for line in (tmp_path / "eval" / "samples.jsonl").read_text().splitlines()]
    _, held_out = split_pairs(30, 1234)
    assert {sample["question"] for sample in samples} == {PROMPT.format(a=a, b=b) for a, b in held_out}
    assert all(request["temperature"] == 0.7 for request in server.requests)
    assert sorted(request["seed"] for request in server.requests) == list(range(30))  # eval_seed 0, one per pair


def test_a_model_name_the_server_does_not_serve_stops_the_env_in_one_line(tokenizer_dir: Path, tmp_path: Path) -> None:
    with ScriptedInference(half_right, only_model="smollm2") as server:
        done = subprocess.run(
            [sys.executable, str(ENVIRONMENTS / "small_sums_env.py"), "evaluate", "--env.tokenizer_name",
             str(tokenizer_dir), "--env.use_wandb", "false", "--env.data_dir_to_save_evals", str(tmp_path / "eval"),
             "--openai.base_url", f"{server.url}/v1", "--openai.model_name", "smolm2",
             "--openai.server_type", "openai"], capture_output=True, text=True, timeout=120)
        asked = len(server.requests)
    assert done.returncode == 2, done.stderr[-3000:]
    assert "serves smollm2, not 'smolm2': pass --openai.model_name smollm2" in done.stderr
    assert "Traceback" not in done.stderr and asked <= 30  # no retries: each held-out pair asked at most once
