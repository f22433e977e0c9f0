"""The small-sums task on its own (standard library only): prompts, the held-out split and the
reward, shared by `small_sums_env.py` and by trainers that do not run atroposlib (TRL, in
``bench/trl_compare.py``), so that every side asks, splits and scores the same way.

Each item asks "What is A + B? Reply with only the number." for digits A and B; a reply
scores 1 when the last number in it is the sum, else 0. The 100 pairs are split once by a
seed: some are held out for evaluation and never trained on, in either order (when 3 + 5 is
held out, so is 5 + 3: a model trained on one has all but seen the other).
"""

import random
import re

PROMPT = "What is {a} + {b}? Reply with only the number."
NUMBER = re.compile(r"-?\d+")


def split_pairs(eval_pairs: int, seed: int) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """All (a, b) digit pairs split by `seed` into (training pairs, `eval_pairs` held-out pairs),
    a pair and its swapped twin always on the same side."""
    if not 0 <= eval_pairs <= 100:
        raise ValueError(f"eval_pairs {eval_pairs}: there are 100 digit pairs")
    unordered = [(a, b) for a in range(10) for b in range(a, 10)]
    random.Random(seed).shuffle(unordered)
    held_out: list[tuple[int, int]] = []
    for a, b in unordered:  # a twin pair takes two places, a double (a + a) one: the count comes out exact
        twins = [(a, b)] if a == b else [(a, b), (b, a)]
        if len(held_out) + len(twins) <= eval_pairs:
            held_out.extend(twins)
    training = [(a, b) for a, b in ((a, b) for a in range(10) for b in range(10)) if (a, b) not in held_out]
    random.Random(seed + 1).shuffle(training)
    return training, held_out


def messages(a: int, b: int) -> list[dict]:
    """The chat that asks for a + b."""
    return [{"role": "user", "content": PROMPT.format(a=a, b=b)}]


def score(reply: str, answer: int) -> float:
    """1.0 when the last number of `reply` is `answer`, else 0.0."""
    numbers = NUMBER.findall(reply)
    return 1.0 if numbers and int(numbers[-1]) == answer else 0.0
