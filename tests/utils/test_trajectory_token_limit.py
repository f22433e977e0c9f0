from pathlib import Path
from typing import Any

import pytest
import transformers

from atroposlib.utils.message_history_utils import ensure_trajectory_token_limit
from atroposlib.utils.tokenize_for_trainer import tokenize_for_trainer


@pytest.fixture(scope="module")
def tokenizer(tokenizer_dir: Path) -> Any:
    return transformers.AutoTokenizer.from_pretrained(tokenizer_dir)


def _conversation(turns: int, tag: str) -> list[dict[str, str]]:
    messages = [{"role": "system", "content": "You play a game."}]
    for turn in range(turns):
        messages += [{"role": "environment", "content": f"observation {turn} " + "x " * 20},
                     {"role": "agent", "content": f"{tag} action {turn}"}]
    return messages


def _step(tokenizer: Any, turns: int, **extra: Any) -> dict[str, Any]:
    alternatives = [_conversation(turns, tag) for tag in ("left", "right")]
    tokenized = [tokenize_for_trainer(tokenizer, a) for a in alternatives]
    step = {"seed": 7, "messages": alternatives, "tokens": [t["tokens"] for t in tokenized],
            "masks": [t["masks"] for t in tokenized], "scores": [1.0, -1.0], "parsed_actions": [0, 1],
            "overrides": [{}, {}]}
    step.update(extra)
    return step


def test_short_steps_pass_unchanged_and_incomplete_steps_are_dropped(tokenizer: Any) -> None:
    short = _step(tokenizer, 1)
    incomplete = _step(tokenizer, 1, parsed_actions=None)
    assert ensure_trajectory_token_limit([short, incomplete], tokenizer, 10_000) == [short]
    assert ensure_trajectory_token_limit([], tokenizer, 10) == []


def test_long_steps_lose_their_oldest_turns_uniformly(tokenizer: Any) -> None:
    long_step = _step(tokenizer, 6)
    limit = len(_step(tokenizer, 3)["tokens"][0]) + 2
    (result,) = ensure_trajectory_token_limit([long_step], tokenizer, limit)
    assert set(result) == {"seed", "messages", "tokens", "masks", "scores", "parsed_actions"}
    assert all(len(tokens) <= limit for tokens in result["tokens"])
    lengths = {len(alternative) for alternative in result["messages"]}
    assert len(lengths) == 1  # the same turns were removed from every alternative
    for alternative, original in zip(result["messages"], long_step["messages"]):
        assert alternative[0] == original[0] and alternative[-2:] == original[-2:]
        assert alternative[1]["role"] == "environment"
    assert result["tokens"][0] == tokenize_for_trainer(tokenizer, result["messages"][0])["tokens"]


def test_steps_that_cannot_fit_are_dropped(tokenizer: Any) -> None:
    assert ensure_trajectory_token_limit([_step(tokenizer, 4)], tokenizer, 5) == []
