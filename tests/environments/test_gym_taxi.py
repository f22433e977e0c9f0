"""gym_taxi in process mode, offline: scripted drivers play whole Taxi episodes.

Each group holds four drivers on the same seeded start: one delivers the passenger (score 1),
one picks the passenger up and then gives up (0), one only drives (including a move west,
action 3, which Atropos's file mistook for a pickup) and gives up (-1), and one answers
nonsense at once (-1). The drivers compute their moves from the observation text with a
shortest-path search over Gymnasium's own map.
"""

from __future__ import annotations

import re
from collections import Counter, deque
from pathlib import Path
from typing import Optional

from gymnasium.envs.toy_text.taxi import MAP
from transformers import AutoTokenizer

from tests.environments.harness import process_groups
from tests.environments.scripted_inference import ScriptedInference

SCRIPT = "game_environments/gymnasium/gym_taxi.py"
MOVES = {0: (1, 0), 1: (-1, 0), 2: (0, 1), 3: (0, -1)}


def can_move(row: int, col: int, action: int) -> bool:
    if action == 0:
        return row < 4
    if action == 1:
        return row > 0
    if action == 2:
        return col < 4 and MAP[row + 1][2 * col + 2] == ":"
    return col > 0 and MAP[row + 1][2 * col] == ":"


def route(start: tuple[int, int], goal: tuple[int, int]) -> list[int]:
    """Shortest list of moves from start to goal on Taxi's map."""
    seen = {start: []}
    queue = deque([start])
    while queue:
        here = queue.popleft()
        if here == goal:
            return seen[here]
        for action, (dr, dc) in MOVES.items():
            if can_move(*here, action):
                there = (here[0] + dr, here[1] + dc)
                if there not in seen:
                    seen[there] = seen[here] + [action]
                    queue.append(there)
    raise AssertionError(f"no route from {start} to {goal}")


def state_of(prompt: str) -> tuple[tuple[int, int], Optional[tuple[int, int]], tuple[int, int]]:
    """(taxi, passenger square or None when on board, destination) from the latest observation."""
    taxi = re.findall(r"Taxi: row (\d), column (\d)", prompt)[-1]
    passenger = re.findall(r"Passenger: (in the taxi|waiting at \w \(\w+, row (\d), column (\d)\))", prompt)[-1]
    destination = re.findall(r"Destination: \w \(\w+, row (\d), column (\d)\)", prompt)[-1]
    on_board = passenger[0] == "in the taxi"
    return ((int(taxi[0]), int(taxi[1])), None if on_board else (int(passenger[1]), int(passenger[2])),
            (int(destination[0]), int(destination[1])))


def best_action(prompt: str) -> int:
    taxi, passenger, destination = state_of(prompt)
    target = destination if passenger is None else passenger
    if taxi == target:
        return 5 if passenger is None else 4
    return route(taxi, target)[0]


class Drivers:
    """The scripted model: a driver per rollout, chosen on the episode's first turn."""

    KINDS = ("deliver", "pickup_then_quit", "drive_west_then_quit", "nonsense")

    def __init__(self) -> None:
        self.starts: Counter[str] = Counter()

    def kind(self, prompt: str) -> str:
        if prompt.count("Taxi: row") == 1:  # first turn: hand out the next driver for this start
            kind = self.KINDS[self.starts[prompt] % len(self.KINDS)]
            self.starts[prompt] += 1
            return kind
        if "pickup-run" in prompt:
            return "pickup_then_quit"
        if "west-run" in prompt:
            return "drive_west_then_quit"
        return "deliver"

    def __call__(self, prompt: str, index: int) -> str:
        kind = self.kind(prompt)
        if kind == "nonsense":
            return "I am not sure what to do."
        if kind == "deliver":
            return str(best_action(prompt))
        if kind == "pickup_then_quit":
            if state_of(prompt)[1] is None:
                return "stop"
            return f"pickup-run {best_action(prompt)}"
        taxi, _, _ = state_of(prompt)  # drive_west_then_quit
        if "west-run 3" in prompt:
            return "stop"
        if can_move(*taxi, 3):
            return "west-run 3"
        return f"west-run {route(taxi, (2, 2))[0]}"


def trained_spans(mask: list[int]) -> int:
    spans, inside = 0, False
    for label in mask:
        if label != -100 and not inside:
            spans += 1
        inside = label != -100
    return spans


def test_taxi_full_episodes_score_delivery_pickup_and_failure(tokenizer_dir: Path, tmp_path: Path) -> None:
    tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    with ScriptedInference(Drivers(), tokenizer) as server:
        groups = process_groups(SCRIPT, tmp_path, server.url, tokenizer_dir, "--env.max_token_length", "60000",
                                steps=2, group_size=4)
    assert len(groups) == 2
    for group in groups:
        assert sorted(group["scores"]) == [-1.0, -1.0, 0.0, 1.0]
        for messages, tokens, mask, score in zip(group["messages"], group["tokens"], group["masks"], group["scores"]):
            roles = [m["role"] for m in messages]
            assert roles == ["user", "assistant"] * (len(roles) // 2)  # every episode ends on the model's answer
            answers = [m["content"] for m in messages if m["role"] == "assistant"]
            assert trained_spans(mask) == len(answers) and len(tokens) == len(mask)
            if score == 1.0:
                taxi, passenger, destination = state_of(messages[0]["content"])
                expected = route(taxi, passenger) + [4] + route(passenger, destination) + [5]
                assert [int(a) for a in answers] == expected
            elif score == 0.0:
                assert any(a == "pickup-run 4" for a in answers) and answers[-1] == "stop"
            elif answers[0].startswith("west-run"):
                # a legal move west (accepted: an observation follows it) is not a pickup
                assert "west-run 3" in answers[:-1] and answers[-1] == "stop"
            else:
                assert answers == ["I am not sure what to do."]
