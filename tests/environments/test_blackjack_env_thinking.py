"""BlackjackEnv (thinking) in process mode, offline: per-step groups of scripted alternatives.

Every turn the scripted model offers four replies: a reasoned stick, a reasoned hit, a reply
with neither a closed reasoning block nor a tool call (played as stick), and a hit with an
empty reasoning block. The test recomputes each alternative's score on its own (the best
outcome reachable from each state by brute force over fresh seeded games, the format terms,
the length tie-break), and checks that the best alternative is the one played on, that an
episode ends when the game does, and that only each reply is trained on.
"""

from __future__ import annotations

import json
import random
from functools import lru_cache
from pathlib import Path

import gymnasium
import pytest
from transformers import AutoTokenizer

from tests.environments.harness import ENVIRONMENTS, process_groups
from tests.environments.scripted_inference import ScriptedInference

SCRIPT = "game_environments/gymnasium/blackjack/blackjack_env_thinking.py"
MAX_TOKEN_LENGTH = 16384  # config_init's


def call(action: str) -> str:
    return "<tool_call>\n" + json.dumps({"name": "take_action", "arguments": {"action": action}}) + "\n</tool_call>"


REPLIES = [  # continuations of "<think>\n"
    "Standing on this total is the safer choice here.\n</think>\n" + call("stick"),
    "Hit.\n</think>\n" + call("hit"),  # shorter: wins ties, so episodes go on
    "no idea",
    "</think>\n" + call("hit"),
]
PARSED = [0, 1, -1, 1]
FORMAT_TERMS = [0.4, 0.4, -0.4, 0.2]  # tool call +-0.2; reasoning +0.2 / 0 (blank) / -0.2 (missing)


@lru_cache(maxsize=None)
def outcome(seed: int, actions: tuple[int, ...]) -> tuple[float, bool]:
    env = gymnasium.make("Blackjack-v1")
    env.reset(seed=seed)
    reward, finished = 0.0, False
    for action in actions:
        _, reward, terminated, truncated, _ = env.step(action)
        finished = terminated or truncated
    return float(reward), finished


@lru_cache(maxsize=None)
def best_value(seed: int, actions: tuple[int, ...]) -> float:
    if actions and outcome(seed, actions)[1]:
        return 0.0
    stick = outcome(seed, actions + (0,))[0]
    hit_reward, hit_done = outcome(seed, actions + (1,))
    return max(stick, hit_reward if hit_done else best_value(seed, actions + (1,)))


def played_action(reply: str) -> int:
    return 1 if '"action": "hit"' in reply else 0


def expected_step(tokenizer, seed: int, history: tuple[int, ...]) -> tuple[list[float], int]:
    """The four alternatives' scores at the state `history` leads to, and the one played."""
    scores = []
    for reply, parsed, terms in zip(REPLIES, PARSED, FORMAT_TERMS):
        full = "<think>\n" + reply
        action = 0 if parsed == -1 else parsed
        reward, done = outcome(seed, history + (action,))
        value_next = 0.0 if done else best_value(seed, history + (action,))
        tiebreak = 0.01 * (1 - min(1.0, len(tokenizer.encode(full)) / MAX_TOKEN_LENGTH))
        scores.append(reward + terms + tiebreak + value_next - best_value(seed, history))
    lengths = [len(tokenizer.encode("<think>\n" + reply)) for reply in REPLIES]
    best = max(range(4), key=lambda i: (scores[i], -lengths[i], -i))
    return scores, 0 if PARSED[best] == -1 else PARSED[best]


def expected_episode(tokenizer, seed: int) -> list[tuple[tuple[int, ...], list[float]]]:
    """(history, scores) of every turn the environment should play from `seed`."""
    steps, history = [], ()
    while len(steps) < 5:  # max_turns
        scores, action = expected_step(tokenizer, seed, history)
        steps.append((history, scores))
        history += (action,)
        if outcome(seed, history)[1]:
            break
    return steps


def test_blackjack_thinking_steps_are_scored_by_exact_values(tokenizer_dir: Path, tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    # deals with episodes of several turns, and one of a single turn, handed out as the env's seeds
    plans = {seed: expected_episode(tokenizer, seed) for seed in range(60)}
    long_ones = [seed for seed, plan in plans.items() if len(plan) >= 2][:2]
    short_one = next(seed for seed, plan in plans.items() if len(plan) == 1)
    seeds = iter(long_ones + [short_one] * 10)
    real_randint = random.randint
    monkeypatch.setattr(random, "randint", lambda a, b: next(seeds) if (a, b) == (0, 1000000) else real_randint(a, b))

    with ScriptedInference(lambda prompt, i: REPLIES[i % 4], tokenizer) as server:
        groups = process_groups(SCRIPT, tmp_path, server.url, tokenizer_dir, "--env.process_concurrency", "1",
                                steps=len(plans[long_ones[0]]) + len(plans[long_ones[1]]) + 1, group_size=4)
    episodes: dict[int, list[dict]] = {}
    for group in groups:
        episodes.setdefault(group["seed"], []).append(group)
    assert list(episodes) == long_ones + [short_one]
    for seed, steps in episodes.items():
        plan = plans[seed]
        assert len(steps) == len(plan)
        for turn, (group, (history, expected)) in enumerate(zip(steps, plan)):
            assert len(group["tokens"]) == len(group["scores"]) == len(group["messages"]) == 4
            assert group["parsed_actions"] == PARSED
            assert group["scores"] == pytest.approx(expected, abs=1e-9)
            for i, reply in enumerate(REPLIES):
                messages = group["messages"][i]
                assert [m["role"] for m in messages] == ["system"] + ["environment", "agent"] * (turn + 1)
                assert messages[-1]["content"] == "<think>\n" + reply
                played = tuple(played_action(m["content"]) for m in messages[2:-1:2])
                assert played == history  # the history holds the moves chosen before
                trained = [t for t in group["masks"][i] if t != -100]
                assert tokenizer.decode(trained).startswith("<think>\n" + reply)  # only the reply (+ end mark)


@pytest.mark.parametrize("variant", ["thinking", "no_thinking"])
def test_local_runner_plays_one_episode(tokenizer_dir: Path, capsys: pytest.CaptureFixture[str], variant: str) -> None:
    import runpy
    import sys

    tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    script = ENVIRONMENTS / "game_environments" / "gymnasium" / "blackjack" / "blackjack_local_server.py"
    answer = (lambda prompt, i: REPLIES[i % 4]) if variant == "thinking" else (lambda prompt, i: call("stick"))
    with ScriptedInference(answer, tokenizer) as server:
        saved = sys.argv[:], sys.path[:]
        sys.argv = [str(script), "--base-url", f"{server.url}/v1", "--model", "scripted", "--tokenizer",
                    str(tokenizer_dir), "--seed", "0", "--variant", variant]
        sys.path[:0] = [str(script.parent), str(script.parents[4])]
        try:
            with pytest.raises(SystemExit) as ended:
                runpy.run_path(str(script), run_name="__main__")
        finally:
            sys.argv, sys.path[:] = saved
    assert ended.value.code == 0
    printed = capsys.readouterr().out
    reward, _ = outcome(0, (0,))
    if variant == "thinking":
        turns = len(expected_episode(tokenizer, 0))
        assert printed.count("--- turn") == turns and printed.count("<- played") == turns
    else:  # sticking at once on seed 0
        assert f"outcome: {reward:+.0f}" in printed


def test_roles_fall_back_to_user_and_assistant_for_templates_that_drop_others(tokenizer_dir: Path) -> None:
    from types import SimpleNamespace

    from environments.game_environments.gymnasium.blackjack.blackjack_env_thinking import BlackjackEnv

    tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    assert BlackjackEnv._roles_the_template_renders(SimpleNamespace(tokenizer=tokenizer)) == ("environment", "agent")
    tokenizer.chat_template = (  # renders only the usual roles, like some real templates
        "{% for m in messages %}{% if m['role'] in ['system', 'user', 'assistant'] %}"
        "<|{{ m['role'] }}|>{{ m['content'] }}<|end|>{% endif %}{% endfor %}")
    assert BlackjackEnv._roles_the_template_renders(SimpleNamespace(tokenizer=tokenizer)) == ("user", "assistant")
