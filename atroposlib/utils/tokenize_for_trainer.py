"""Turning a chat into trainer inputs: token ids and label masks.

A mask is a label array: ``-100`` where the trainer ignores the position, the token id
where it learns it. By default only the last message (and the chat template's
end-of-turn tokens after it) is trainable.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any, Sequence

log = logging.getLogger("atroposlib.utils")

UNMASKED_ROLES = ["assistant", "agent"]


def token_ids(tokenized: Any) -> list[int]:
    """Normalise what ``apply_chat_template(..., tokenize=True)`` returned to a flat
    ``list[int]``: transformers 5 returns a mapping, some tokenizers a batch of one, a
    tensor or an array."""
    if isinstance(tokenized, Mapping):
        tokenized = tokenized["input_ids"]
    if hasattr(tokenized, "tolist"):
        tokenized = tokenized.tolist()
    if tokenized and isinstance(tokenized[0], (list, tuple)):
        if len(tokenized) != 1:
            raise ValueError(f"expected one tokenized sequence, got a batch of {len(tokenized)}")
        tokenized = tokenized[0]
    return [int(t) for t in tokenized]


def apply_template(tokenizer: Any, chat: Sequence[dict[str, Any]], add_generation_prompt: bool) -> list[int]:
    """Token ids of `chat` rendered by the tokenizer's chat template."""
    if not chat:
        return []
    try:
        tokenized = tokenizer.apply_chat_template(
            list(chat), tokenize=True, add_generation_prompt=add_generation_prompt, return_dict=False
        )
    except TypeError:  # tokenizers whose template call predates return_dict
        tokenized = tokenizer.apply_chat_template(list(chat), tokenize=True, add_generation_prompt=add_generation_prompt)
    return token_ids(tokenized)


def tokenize_for_trainer(
    tokenizer: Any,
    chat: Sequence[dict[str, Any]],
    include_messages: bool = False,
    train_on_all_assistant_turns: bool = False,
    finish_reason: str = "",
) -> dict[str, Any]:
    """Tokens and masks of `chat` for training (plus the messages when asked).

    `train_on_all_assistant_turns` makes every assistant turn trainable instead of only
    the last message. With ``finish_reason="length"`` a trailing end-of-sequence token
    the template added (but the model never produced) is removed.
    """
    tokens = apply_template(tokenizer, chat, add_generation_prompt=False)
    if train_on_all_assistant_turns:
        masks = [-100] * len(tokens)
        for i, message in enumerate(chat):
            if message.get("role") in UNMASKED_ROLES:
                start = len(apply_template(tokenizer, chat[:i], add_generation_prompt=True))
                end = len(apply_template(tokenizer, chat[: i + 1], add_generation_prompt=False))
                masks[start:end] = tokens[start:end]
    else:
        prompt_length = len(apply_template(tokenizer, chat[:-1], add_generation_prompt=True))
        masks = [-100] * prompt_length + tokens[prompt_length:]
    if finish_reason == "length" and tokens and tokens[-1] == tokenizer.eos_token_id:
        tokens, masks = tokens[:-1], masks[:-1]
    result: dict[str, Any] = {"tokens": tokens, "masks": masks}
    if include_messages:
        result["messages"] = list(chat)
    return result
