"""environments/text_reversal_environment.py (TextReversalEnv): exact reversals inside one
<reversed_text> block score 1.0, anything else 0.0; too-short responses are asked again."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

from transformers import AutoTokenizer

from environments.text_reversal_environment import APIServerConfig, TextReversalConfig, TextReversalEnv
from tests.environments.harness import ENVIRONMENTS, process_groups, run_cli
from tests.environments.scripted_inference import ScriptedInference

FIXTURES = ENVIRONMENTS / "fixtures" / "text_reversal"
TEXTS = [json.loads(line)["text"] for name in ("train.jsonl", "test.jsonl")
         for line in (FIXTURES / name).read_text().splitlines()]


def _text(prompt: str) -> str:
    return max((t for t in TEXTS if t in prompt), key=len)


CASES = [  # (answer for choice i, expected score)
    (lambda t: f"<think>case0: reversing.</think><reversed_text>{t[::-1]}</reversed_text>", 1.0),
    (lambda t: f"<think>case1: reversing.</think><reversed_text>{t}</reversed_text>", 0.0),
    (lambda t: f"case2 without thinking <reversed_text>{t[::-1]}</reversed_text>", 0.0),
    (lambda t: f"<think>case3</think><reversed_text>{t[::-1]}</reversed_text><reversed_text>x</reversed_text>", 0.0),
    (lambda t: f"<think>case4</think>Here it is:\n<reversed_text>\n  {t[::-1]}\n</reversed_text>", 1.0),
]


def test_process_and_evaluate_score_exact_reversals(tokenizer_dir: Path, tmp_path: Path) -> None:
    def answer(prompt: str, index: int) -> str:
        return CASES[index % len(CASES)][0](_text(prompt))

    with ScriptedInference(answer, AutoTokenizer.from_pretrained(str(tokenizer_dir))) as server:
        data = ["--env.train_dataset", str(FIXTURES / "train.jsonl"), "--env.eval_dataset", str(FIXTURES / "test.jsonl")]
        groups = process_groups("text_reversal_environment.py", tmp_path, server.url, tokenizer_dir, *data,
                                steps=2, group_size=5)
        run_cli("text_reversal_environment.py", "evaluate", "--env.tokenizer_name", str(tokenizer_dir),
                "--openai.base_url", f"{server.url}/v1", "--openai.model_name", "scripted", "--env.use_wandb", "false",
                "--env.data_dir_to_save_evals", str(tmp_path / "evals"), *data)
    assert len(groups) == 2
    for group in groups:
        assert sorted(group["scores"]) == [0.0, 0.0, 0.0, 1.0, 1.0]
        for messages, score in zip(group["messages"], group["scores"]):
            case = next(i for i in range(5) if f"case{i}" in messages[-1]["content"])
            assert score == CASES[case][1]
            assert messages[0]["role"] == "system" and "<think>" in messages[0]["content"]  # thinking mode
            assert "<reversed_text>" in messages[1]["content"]
    metrics = json.loads((tmp_path / "evals" / "metrics.json").read_text())
    flat = json.dumps(metrics)
    assert '"eval/percent_correct": 1.0' in flat and '"eval/format_compliance_rate": 1.0' in flat


def test_short_responses_are_requested_again_and_plain_mode_reads_the_whole_answer(tokenizer_dir: Path) -> None:
    requests: list[str] = []

    def answer(prompt: str, index: int) -> str:
        if index == 0:
            requests.append(prompt)
        text = _text(prompt)
        if len(requests) == 1:  # the first request: only EOS-like scraps
            return "ok"
        return f"<reversed_text>{text[::-1] if index % 2 == 0 else text}</reversed_text>"

    async def play(env: Any) -> Any:
        await env.setup()
        group, _ = await env.collect_trajectories(await env.get_next_item())
        await env.server.close()
        return group

    with ScriptedInference(answer, AutoTokenizer.from_pretrained(str(tokenizer_dir))) as server:
        config = TextReversalConfig(
            tokenizer_name=str(tokenizer_dir), group_size=4, use_wandb=False, thinking_mode=False, retry_delay=0.0,
            train_dataset=str(FIXTURES / "train.jsonl"), eval_dataset=str(FIXTURES / "test.jsonl"),
        )
        env = TextReversalEnv(config, [APIServerConfig(model_name="scripted", base_url=f"{server.url}/v1", api_key="x",
                                                       health_check=False)], slurm=False)
        group = asyncio.run(play(env))
    assert len(requests) == 2
    assert sorted(group["scores"]) == [0.0, 0.0, 1.0, 1.0]
    assert group["messages"][0][0] == {"role": "system", "content": ""}
