"""blackjack_no_thinking in process mode, offline: scripted players play whole episodes.

Each group holds three players on the same (random) deal: one sticks at once, one hits
until 17 or more and then sticks, one answers without a tool call (-1 at once). The deals'
seeds are recorded by wrapping `gymnasium.make`, and each group's scores are checked against
the same policies replayed on a fresh game with that seed.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path

import gymnasium
import pytest
from transformers import AutoTokenizer

from tests.environments.harness import process_groups
from tests.environments.scripted_inference import ScriptedInference

SCRIPT = "game_environments/gymnasium/blackjack/blackjack_env_no_thinking.py"
HAND = re.compile(r"Your hand totals (\d+)\. The dealer shows (\d+)")


def call(action: str) -> str:
    return "<tool_call>\n" + json.dumps({"name": "take_action", "arguments": {"action": action}}) + "\n</tool_call>"


class Players:
    KINDS = ("stick", "hit_to_17", "no_tool_call")

    def __init__(self) -> None:
        self.deals: Counter[str] = Counter()

    def __call__(self, prompt: str, index: int) -> str:
        hands = HAND.findall(prompt)
        if len(hands) == 1:  # first turn of an episode: the next player for this deal
            kind = self.KINDS[self.deals[prompt] % len(self.KINDS)]
            self.deals[prompt] += 1
        else:
            kind = "hit_to_17"  # only this player ever gets a second turn
        if kind == "no_tool_call":
            return "I would like to stick, please."
        if kind == "stick":
            return call("stick")
        return call("hit" if int(hands[-1][0]) < 17 else "stick")


def replay(seed: int, kind: str) -> float:
    """The outcome of `kind` on a fresh game from `seed`."""
    if kind == "no_tool_call":
        return -1.0
    env = gymnasium.make("Blackjack-v1")
    (total, _, _), _ = env.reset(seed=seed)
    while True:
        action = 1 if kind == "hit_to_17" and total < 17 else 0
        (total, _, _), reward, terminated, truncated, _ = env.step(action)
        if terminated or truncated:
            return float(reward)


@pytest.fixture
def recorded_seeds(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    seeds: list[int] = []
    real_make = gymnasium.make

    def make(*args, **kwargs):
        env = real_make(*args, **kwargs)
        real_reset = env.reset

        def reset(*, seed=None, options=None):
            seeds.append(seed)
            return real_reset(seed=seed, options=options)

        env.reset = reset
        return env

    monkeypatch.setattr(gymnasium, "make", make)
    return seeds


def test_blackjack_episodes_score_the_game_outcome(tokenizer_dir: Path, tmp_path: Path,
                                                    recorded_seeds: list[int]) -> None:
    tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    with ScriptedInference(Players(), tokenizer) as server:
        groups = process_groups(SCRIPT, tmp_path, server.url, tokenizer_dir, steps=3, group_size=3)
    assert len(groups) == 3
    seeds = set(recorded_seeds)
    assert len(recorded_seeds) == 9 and len(seeds) == 3  # three rollouts per deal
    matched = set()
    for group in groups:
        first_hand = group["messages"][0][1]["content"]
        candidates = [seed for seed in seeds if seed not in matched and
                      first_hand == _first_observation(seed)]
        expected = {seed: sorted(replay(seed, kind) for kind in Players.KINDS) for seed in candidates}
        seed = next(s for s, scores in expected.items() if scores == sorted(group["scores"]))
        matched.add(seed)
        for messages, mask in zip(group["messages"], group["masks"]):
            assert messages[0]["role"] == "system" and messages[-1]["role"] == "assistant"
            answers = [m["content"] for m in messages if m["role"] == "assistant"]
            assert sum(1 for a, b in zip([-100] + mask, mask) if a == -100 and b != -100) == len(answers)
            if answers[0].startswith("I would like"):
                assert answers == ["I would like to stick, please."]
            elif len(answers) > 1:  # the hitter: an observation after every hit
                assert [m["role"] for m in messages[1:]] == ["user", "assistant"] * len(answers)


def _first_observation(seed: int) -> str:
    env = gymnasium.make("Blackjack-v1")
    (total, dealer, ace), _ = env.reset(seed=seed)
    return (f"Your hand totals {total}. The dealer shows {dealer} (1 is an ace). "
            f"Usable ace in your hand: {'yes' if ace else 'no'}.")
