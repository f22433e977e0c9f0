"""Scored groups for comparing the dataset tools with Atropos 0.4.0's, made with the test tokenizer.

Every case is a group whose decoded rollouts share a prompt that does not occur again in
any completion (Atropos's tools split on the prompt string; this project splits by
position, and both agree only then).
"""

from __future__ import annotations

import random
from typing import Any

QUESTIONS = ["What is 2 + 2?", "Compute 12 times 3.", "Hello there, how are you?", "Think step by step."]
ANSWERS = ["4", "The answer is 4.", "36", "Answer: 36", "doing today", "\\boxed{7}", "you are", "7 times"]
SCORE_CHOICES = [1.0, 0.5, 0.0, -0.5, -1.0, 0.75, 0.25, 2.0]


def make_groups(tokenizer: Any, count: int, seed: int, size: int = 0) -> list[dict[str, Any]]:
    """`count` groups of `size` (default: 2-8) rollouts with repeated, negative and tied scores."""
    rng = random.Random(seed)
    groups = []
    for _ in range(count):
        question = rng.choice(QUESTIONS)
        rollouts = size or rng.randint(2, 8)
        answers = [rng.choice(ANSWERS) for _ in range(rollouts)]
        chats = [[{"role": "user", "content": question}, {"role": "assistant", "content": answer}] for answer in answers]
        tokens = [list(tokenizer.apply_chat_template(chat, tokenize=True, return_dict=True)["input_ids"]) for chat in chats]
        groups.append({
            "tokens": tokens, "masks": [[-100] * len(t) for t in tokens],
            "scores": [rng.choice(SCORE_CHOICES) for _ in range(rollouts)], "messages": chats,
        })
    return groups
