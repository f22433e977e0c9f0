"""The ★ environments against the real vLLM engine on the bundled SmolLM2-135M: the wiring.

One engine for the session (tests/real_engine.py), one short group or episode each, small
generation budgets. A 135M model scores poorly; what is checked is that each environment
runs through the real inference path and writes well-formed groups (or evaluation files).
The multimodal ★ environments (OCR-VQA, CLEVR) are left out: the bundled model reads no
images, and vLLM refuses image parts for it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from atroposlib.local.vllm_service import LocalVLLM
from tests.environments.harness import ENVIRONMENTS, process_groups, run_cli

pytestmark = [pytest.mark.real_vllm, pytest.mark.slow, pytest.mark.timeout(900)]
FIXTURES = ENVIRONMENTS / "fixtures"
ALLOW_EQUAL = ("--env.ensure_scores_are_not_same", "false")

# script, server_type, group size, flags (fixture data and small budgets)
STARRED: list[tuple[str, str, int, tuple[str, ...]]] = [
    ("rlaif_server.py", "vllm", 2, (
        "--env.train_file", str(FIXTURES / "rlaif" / "train.jsonl"), "--env.max_token_length", "96")),
    ("code_execution_server/coding_server.py", "openai", 2, (
        "--env.train_file", str(FIXTURES / "code_execution_server" / "train.jsonl"),
        "--env.test_file", str(FIXTURES / "code_execution_server" / "test.jsonl"), "--env.max_token_length", "320")),
    # One turn or two of short replies per episode is the wiring (Taxi's first prompt takes ~530
    # tokens of its 640); the games' rules and longer episodes have their own tests.
    ("game_environments/gymnasium/gym_taxi.py", "openai", 2, ("--env.max_token_length", "640")),
    ("game_environments/gymnasium/blackjack/blackjack_env_no_thinking.py", "openai", 2, (
        "--env.max_token_length", "1024", "--env.max_episode_turns", "1")),
    ("game_environments/gymnasium/blackjack/blackjack_env_thinking.py", "openai", 2, (
        "--env.max_token_length", "640", "--env.max_turns", "1")),
]


def assert_well_formed(group: dict[str, Any]) -> None:
    tokens, masks, scores = group["tokens"], group["masks"], group["scores"]
    assert len(tokens) == len(masks) == len(scores) >= 1
    for sequence, mask in zip(tokens, masks):
        assert len(sequence) == len(mask) and any(m != -100 for m in mask)
        assert all(m == -100 or m == t for m, t in zip(mask, sequence))
    assert all(isinstance(score, (int, float)) for score in scores)


@pytest.mark.parametrize("script, server_type, group_size, flags", STARRED, ids=[s[0] for s in STARRED])
def test_starred_environment_runs_on_the_real_engine(script: str, server_type: str, group_size: int,
                                                     flags: tuple[str, ...], real_vllm: LocalVLLM,
                                                     tmp_path: Path) -> None:
    base = real_vllm.base_url.removesuffix("/v1")
    groups = process_groups(script, tmp_path, base, real_vllm.model_dir, *flags, *ALLOW_EQUAL, steps=1,
                            group_size=group_size, server_type=server_type, model_name=real_vllm.served_name)
    assert groups, f"{script} wrote no group"
    for group in groups:
        assert_well_formed(group)


def test_textworld_plays_a_real_game_on_the_real_engine(real_vllm: LocalVLLM, tmp_path: Path) -> None:
    pytest.importorskip("textworld", reason="the games extra (textworld) is not installed")
    server = {"base_url": real_vllm.base_url, "model_name": real_vllm.served_name, "api_key": "x",
              "server_type": "openai", "tokenizer_name": str(real_vllm.model_dir)}
    config = tmp_path / "tw.yaml"
    config.write_text(yaml.safe_dump({"env": {"challenge_names": ["tw-coin_collector"],
                                              "randomize_challenge_settings": False},
                                      "openai": [server, server]}))
    out = tmp_path / "groups.jsonl"
    run_cli("game_environments/textworld_env/textworld_env.py", "process", "--config", str(config),
            "--env.tokenizer_name", str(real_vllm.model_dir), "--env.group_size", "2", "--env.max_steps", "2",
            "--env.total_steps", "1", "--env.use_wandb", "false", "--env.data_path_to_save_groups", str(out),
            "--env.spool_dir", str(tmp_path / "spool"), "--env.max_token_length", "2048", *ALLOW_EQUAL)
    groups = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(groups) == 1
    assert_well_formed(groups[0])


# script, test fixture, flags: environments that drop groups whose scores are all equal (as
# Atropos's do), which a 135M model's groups nearly always are, show their wiring in evaluate.
EVALUATED: list[tuple[str, str, tuple[str, ...]]] = [
    ("eval_environments/mmlu_eval.py", "mmlu_eval/test.jsonl", ("--env.eval_max_tokens", "64")),
    ("tool_calling_server.py", "tool_calling/test.jsonl", (  # prompts under 380 tokens, answers up to ~130
        "--env.max_token_length", "512", "--env.train_file", str(FIXTURES / "tool_calling" / "train.jsonl"))),
    ("fundamental_prediction_environment.py", "fundamental_prediction/fundamentals.jsonl", (
        "--env.max_token_length", "384",  # a prompt of ~220 tokens, an answer of up to ~160
        "--env.train_file", str(FIXTURES / "fundamental_prediction" / "fundamentals.jsonl"))),
]


@pytest.mark.parametrize("script, fixture, flags", EVALUATED, ids=[e[0] for e in EVALUATED])
def test_starred_environment_evaluates_on_the_real_engine(script: str, fixture: str, flags: tuple[str, ...],
                                                          real_vllm: LocalVLLM, tmp_path: Path) -> None:
    rows = (FIXTURES / fixture).read_text().splitlines()[:2]
    test_file = tmp_path / "test.jsonl"
    test_file.write_text("\n".join(rows) + "\n")
    evals = tmp_path / "evals"
    run_cli(script, "evaluate", "--env.tokenizer_name", str(real_vllm.model_dir),
            "--openai.base_url", real_vllm.base_url, "--openai.model_name", real_vllm.served_name,
            "--openai.api_key", "x", "--env.test_file", str(test_file), "--env.use_wandb", "false",
            "--env.data_dir_to_save_evals", str(evals), *flags)
    results = json.loads((evals / "metrics.json").read_text())["results"]["all"]
    assert results and all(isinstance(value, (int, float, str, bool)) for value in results.values())
    assert (evals / "samples.jsonl").read_text().strip()
