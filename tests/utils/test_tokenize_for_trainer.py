"""tokenize_for_trainer masks exactly the prompt, on the installed transformers version."""

from __future__ import annotations

from pathlib import Path

import pytest

transformers = pytest.importorskip("transformers")

from atroposlib.utils.tokenize_for_trainer import token_ids, tokenize_for_trainer  # noqa: E402

CHAT = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "What is 2 + 2?"},
    {"role": "assistant", "content": "The answer is 4."},
]


@pytest.fixture
def tokenizer(tokenizer_dir: Path):
    return transformers.AutoTokenizer.from_pretrained(tokenizer_dir)


def test_last_turn_is_the_only_trainable_part(tokenizer) -> None:
    out = tokenize_for_trainer(tokenizer, CHAT)
    prompt = token_ids(tokenizer.apply_chat_template(CHAT[:-1], tokenize=True, add_generation_prompt=True))
    assert out["tokens"][: len(prompt)] == prompt
    assert out["masks"] == [-100] * len(prompt) + out["tokens"][len(prompt):]
    assert "The answer is 4.<|end|>" == tokenizer.decode(out["tokens"][len(prompt):])
    assert "messages" not in out and tokenize_for_trainer(tokenizer, CHAT, include_messages=True)["messages"] == CHAT


def test_all_assistant_turns(tokenizer) -> None:
    chat = CHAT + [{"role": "user", "content": "And 12 times 3?"}, {"role": "assistant", "content": "36"}]
    out = tokenize_for_trainer(tokenizer, chat, train_on_all_assistant_turns=True)
    trained = tokenizer.decode([t for t, m in zip(out["tokens"], out["masks"]) if m != -100])
    assert trained == "The answer is 4.<|end|>36<|end|>"


def test_length_finish_drops_the_template_eos(tokenizer) -> None:
    tokenizer.chat_template = tokenizer.chat_template + "{{ eos_token }}"
    full = tokenize_for_trainer(tokenizer, CHAT)
    cut = tokenize_for_trainer(tokenizer, CHAT, finish_reason="length")
    assert full["tokens"][-1] == tokenizer.eos_token_id and cut["tokens"] == full["tokens"][:-1]
    assert len(cut["masks"]) == len(cut["tokens"])


def test_token_ids_normalises_every_return_shape() -> None:
    assert token_ids({"input_ids": [1, 2]}) == [1, 2]
    assert token_ids([[3, 4]]) == [3, 4]
    assert token_ids([5]) == [5]
    with pytest.raises(ValueError):
        token_ids([[1], [2]])
