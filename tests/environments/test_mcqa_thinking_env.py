"""environments/mcqa_thinking_env.py (MCQAThinkingEnv): the chosen letter is scored +1 / -1,
and every broken format (think block, missing or repeated answer) scores -1."""

from __future__ import annotations

import json
from pathlib import Path

from transformers import AutoTokenizer

from environments.mcqa_thinking_env import extract_mcqa_answer
from tests.environments.harness import ENVIRONMENTS, process_groups, run_cli
from tests.environments.scripted_inference import ScriptedInference

FIXTURE = ENVIRONMENTS / "fixtures" / "mcqa_thinking" / "academic_mcqa.jsonl"
ROWS = [json.loads(line) for line in FIXTURE.read_text().splitlines()]


def _row(prompt: str) -> dict:
    return next(row for row in ROWS if row["prompt"] in prompt)


def _wrong(letter: str) -> str:
    return "A" if letter != "A" else "B"


# (case, expected score) for choice index i; each answer names its case inside the text
CASES = [
    (lambda r: f"<think>case0</think> The best answer is: {r['ground_truth']}", 1.0),
    (lambda r: f"<think>case1</think> The best answer is: {_wrong(r['ground_truth'])}", -1.0),
    (lambda r: f"case2 no thinking block. The best answer is: {r['ground_truth']}", -1.0),
    (lambda r: f"<think>case3</think> The answer is {r['options'][r['answer']]}.", 1.0),
    (lambda r: f"<think>case4</think> The answer is {r['ground_truth']}. The best answer is: {_wrong(r['ground_truth'])}", -1.0),
    (lambda r: f"<think>case5</think> **The best answer is {r['ground_truth']}**", 1.0),
    (lambda r: f"<think>case6</think> So: \\boxed{{{r['ground_truth']}}}", 1.0),
    (lambda r: f"<think>case7</think><think>again</think> The best answer is: {r['ground_truth']}", -1.0),
]


def answer(prompt: str, index: int) -> str:
    return CASES[index % len(CASES)][0](_row(prompt))


def test_process_scores_letters_and_formats(tokenizer_dir: Path, tmp_path: Path) -> None:
    with ScriptedInference(answer, AutoTokenizer.from_pretrained(str(tokenizer_dir))) as server:
        groups = process_groups("mcqa_thinking_env.py", tmp_path, server.url, tokenizer_dir,
                                "--env.train_file", str(FIXTURE), steps=2, group_size=8)
        run_cli("mcqa_thinking_env.py", "evaluate", "--env.tokenizer_name", str(tokenizer_dir),
                "--openai.base_url", f"{server.url}/v1", "--openai.model_name", "scripted",
                "--env.train_file", str(FIXTURE), "--env.use_wandb", "false",
                "--env.data_dir_to_save_evals", str(tmp_path / "evals"))
    assert len(groups) == 2
    for group in groups:
        assert len(group["scores"]) == 8
        for messages, score in zip(group["messages"], group["scores"]):
            case = next(i for i in range(8) if f"case{i}" in messages[-1]["content"])
            assert score == CASES[case][1], (case, messages[-1]["content"])
    # evaluation: one held-out question (2% of 12), answered by choice 0, which is right
    metrics = (tmp_path / "evals" / "metrics.json").read_text()
    assert '"eval/percent_correct": 1.0' in metrics


def test_extraction_rules() -> None:
    think = "<think>reasoning</think>"
    assert extract_mcqa_answer(think + " The correct answer is (C).", "Coulomb", "C") == "C"
    assert extract_mcqa_answer(think + " Thus, final answer: D)", "x", "A") == "D"
    assert extract_mcqa_answer(think + " The best answer is: B) Mitochondrion", "Mitochondrion", "B") == "B"
    assert extract_mcqa_answer(think + " The answer is about balance.", "x", "A") is None  # "a" is not a letter
    assert extract_mcqa_answer(think + " The answer is B. The answer is B.", "x", "B") is None  # said twice
    assert extract_mcqa_answer("The answer is B </think> <think>", "x", "B") is None
    assert extract_mcqa_answer(think + " I am not sure.", "x", "B") is None
