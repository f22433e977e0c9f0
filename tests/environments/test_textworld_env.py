"""textworld_minimal in process mode, offline, on real generated TextWorld games.

The group is a freshly generated one-room ``tw-coin_collector`` game. Half of the scripted
players take the coin at once (the game is won: score 1), the other half only ``look``
until ``max_steps`` commands are used (score 0). The environment's default servers are
four, so the scripted server is given in a YAML file (``--openai.*`` flags are refused).
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
import yaml
from transformers import AutoTokenizer

from tests.doc_blocks import doc_block
from tests.environments.harness import ENVIRONMENTS, run_cli
from tests.environments.scripted_inference import ScriptedInference

pytest.importorskip("textworld")

SCRIPT = "game_environments/textworld_env/textworld_env.py"


class Players:
    """Even-numbered players of a game take the coin; the others only look around."""

    def __init__(self) -> None:
        self.games: Counter[str] = Counter()

    def __call__(self, prompt: str, index: int) -> str:
        if prompt.count("Objective:") == 1:  # a game's first turn
            player = self.games[prompt]
            self.games[prompt] += 1
            return "take coin" if player % 2 == 0 else "look"
        return "look"


def test_textworld_games_score_the_final_game_score(tokenizer_dir: Path, tmp_path: Path) -> None:
    tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    out = tmp_path / "groups.jsonl"
    with ScriptedInference(Players(), tokenizer) as server:
        # environments/README.md's tw.yaml (one server listed twice), pointed at the scripted server
        servers = yaml.safe_load(doc_block("environments/README.md", "textworld-yaml").replace(
            "http://127.0.0.1:9001/v1", f"{server.url}/v1"))["openai"]
        config = tmp_path / "tw.yaml"
        config.write_text(yaml.safe_dump({
            "env": {"challenge_names": ["tw-coin_collector"], "randomize_challenge_settings": False},
            "openai": [{**entry, "tokenizer_name": str(tokenizer_dir)} for entry in servers],
        }))
        run_cli(SCRIPT, "process", "--config", str(config), "--env.tokenizer_name", str(tokenizer_dir),
                "--env.group_size", "4", "--env.max_steps", "3", "--env.total_steps", "1",
                "--env.use_wandb", "false", "--env.data_path_to_save_groups", str(out),
                "--env.spool_dir", str(tmp_path / "spool"))
    groups = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(groups) == 1
    for group in groups:
        assert sorted(group["scores"]) == [0.0, 0.0, 1.0, 1.0]
        for messages, mask, score in zip(group["messages"], group["masks"], group["scores"]):
            assert messages[0]["role"] == "system" and "Objective:" in messages[1]["content"]
            commands = [m["content"] for m in messages if m["role"] == "assistant"]
            assert sum(1 for a, b in zip([-100] + mask, mask) if a == -100 and b != -100) == len(commands)
            if score == 1.0:  # won at once: the game ends on the winning command
                assert commands == ["take coin"] and messages[-1]["role"] == "assistant"
            else:  # three commands (max_steps), an observation after each
                assert commands == ["look"] * 3 and messages[-1]["role"] == "user"
                assert "Score: 0/1" in messages[-1]["content"]
    assert not list((tmp_path).glob("**/*.z8"))


def test_registry_draws_reproducible_settings_within_the_options() -> None:
    import sys

    sys.path.insert(0, str(ENVIRONMENTS / "game_environments" / "textworld_env"))
    try:
        from textworld_registry import TextWorldChallengeRegistry, create_textworld_registry
    finally:
        sys.path.pop(0)
    first = [create_textworld_registry(7).get_challenge("tw-cooking") for _ in range(1)]
    again = [create_textworld_registry(7).get_challenge("tw-cooking") for _ in range(1)]
    assert first == again
    name, settings = first[0]
    for key, options in TextWorldChallengeRegistry.CHALLENGES[name].items():
        assert settings[key] in options
    assert 0 <= settings["seed"] <= 0xFFFFFFFF and "recipe-seed" in settings
    assert create_textworld_registry(1).get_challenge("tw-simple", randomize_settings=False)[1]["rewards"] == "sparse"
    with pytest.raises(ValueError):
        create_textworld_registry().get_challenge("tw-nope")
