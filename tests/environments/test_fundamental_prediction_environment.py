"""environments/fundamental_prediction_environment.py (FundamentalPredictionEnv): direction and
magnitude scoring, binarised to +1 / -1, with the think and statement format enforced."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from environments.fundamental_prediction_environment import extract_prediction, magnitude_score
from tests.environments.harness import ENVIRONMENTS, process_groups, run_cli
from tests.environments.scripted_inference import ScriptedInference

FIXTURE = ENVIRONMENTS / "fixtures" / "fundamental_prediction" / "fundamentals.jsonl"
ROWS = [json.loads(line) for line in FIXTURE.read_text().splitlines()]


def _row(prompt: str) -> dict:
    return next(row for row in ROWS if row["context"] in prompt)


def _other(direction: str) -> str:
    return "raised" if direction != "raised" else "reduced"


def _say(metric: str, direction: str, magnitude) -> str:
    return f"The {metric} will be: {direction} and the magnitude will be: {magnitude}%"


CASES = [  # (answer from the row, expected reward)
    (lambda r: f"<think>case0</think>\n{_say(r['fundamental_metric'], r['answer'], r['magnitude'])}", 1.0),
    (lambda r: f"<think>case1</think>\n{_say(r['fundamental_metric'], r['answer'], 95)}", 1.0),  # direction only
    (lambda r: f"<think>case2</think>\n{_say(r['fundamental_metric'], _other(r['answer']), 5)}", -1.0),
    (lambda r: f"case3 no thinking\n{_say(r['fundamental_metric'], r['answer'], r['magnitude'])}", -1.0),
    (lambda r: "<think>case4</think>\n" + _say(r["fundamental_metric"], r["answer"], 1) + "\n"
     + _say(r["fundamental_metric"], r["answer"], 2), -1.0),  # two predictions
    (lambda r: f"<think>case5</think>\n{_say('share count', r['answer'], r['magnitude'])}", -1.0),  # wrong metric
]


def answer(prompt: str, index: int) -> str:
    return CASES[index % len(CASES)][0](_row(prompt))


def test_process_and_evaluate(tokenizer_dir: Path, tmp_path: Path) -> None:
    with ScriptedInference(answer, AutoTokenizer.from_pretrained(str(tokenizer_dir))) as server:
        groups = process_groups("fundamental_prediction_environment.py", tmp_path, server.url, tokenizer_dir,
                                "--env.train_file", str(FIXTURE), steps=2, group_size=6, server_type="vllm")
        run_cli("fundamental_prediction_environment.py", "evaluate", "--env.tokenizer_name", str(tokenizer_dir),
                "--openai.base_url", f"{server.url}/v1", "--openai.model_name", "scripted", "--env.use_wandb", "false",
                "--env.train_file", str(FIXTURE), "--env.data_dir_to_save_evals", str(tmp_path / "evals"))
    assert len(groups) == 2
    for group in groups:
        assert len(group["inference_logprobs"]) == 6
        for messages, score in zip(group["messages"], group["scores"]):
            case = next(i for i in range(6) if f"case{i}" in messages[-1]["content"])
            assert score == CASES[case][1], messages[-1]["content"]
    # one held-out row, answered by choice 0: right direction and exact magnitude
    metrics = (tmp_path / "evals" / "metrics.json").read_text()
    for key, value in (("direction_accuracy", 1.0), ("magnitude_accuracy", 1.0), ("combined_score", 2.0)):
        assert f'"eval/{key}": {value}' in metrics


def test_magnitude_tiers_and_extraction() -> None:
    assert [magnitude_score(p, "10") for p in (10, 10.5, 14, "19%", 25, 31, "n/a")] == [1.0, 0.9, 0.7, 0.5, 0.3, 0.0, 0.0]
    text = "<think>x</think> The Dividend will be: RAISED and the magnitude will be: +4.5%"
    assert extract_prediction(text, "dividend") == ("raised", "+4.5")
    assert extract_prediction(text.replace("<think>x</think>", "</think>x<think>"), "dividend") == (None, None)
    assert extract_prediction("<think>x</think> it will go up", "dividend") == (None, None)


def test_very_long_responses_lose_reward(tokenizer_dir: Path) -> None:
    from environments.fundamental_prediction_environment import (
        APIServerConfig,
        FundamentalPredictionConfig,
        FundamentalPredictionEnv,
    )

    config = FundamentalPredictionConfig(tokenizer_name=str(tokenizer_dir), use_wandb=False)
    env = FundamentalPredictionEnv(config, [APIServerConfig(model_name="x", base_url="http://127.0.0.1:9/v1",
                                                            health_check=False)], slurm=False)
    item = {"fundamental_metric": "dividend", "answer": "raised", "magnitude": "8"}
    short = "<think>a</think>" + _say("dividend", "raised", 8)
    padded = "<think>" + "thinking " * 60 + "</think>" + _say("dividend", "raised", 8)
    short_length, padded_length = (len(env.tokenizer.encode(t, add_special_tokens=False)) for t in (short, padded))
    env.config.max_token_length = int((short_length + padded_length) / 2 / 0.95)  # 95 % lies between the two
    assert env.reward(short, item)[0] == 2.0
    assert env.reward(padded, item)[0] == pytest.approx(2.0 - 0.5 * padded_length / env.config.max_token_length)
    wrong = padded.replace("raised", "reduced")
    assert env.reward(wrong, item)[0] < 0
