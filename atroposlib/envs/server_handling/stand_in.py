"""`StandInServer`: the scripted inference server ``env.py check`` runs an environment against.

A stand-in is not a model: it answers from a script, so that an environment's contract can
be checked in seconds with no GPU and no internet. Its answers vary on purpose: the j-th
completion asked for while one item is collected is ``answers[j % len(answers)]``, where
`answers_for(item)` builds the list from the item itself, in the answer shapes environments
commonly parse (``\\boxed{}``, ``<answer>``, "the best answer is:", the last number; some after a
``<think>`` block), each a sentence, long enough for environments that drop very short answers:

* first, every shape of each value under a key that names an answer (``answer``, ``gold``,
  ``solution``, ``target``, ``label``, ...), with a wrong answer second;
* then each shape of the item's other short values, of the numbers in its strings and of the
  sums of two of its numbers.

So a reward that reads the answer usually sees right and wrong ones in a group, and a reward
that ignores it shows up as scores that never vary. Token requests (`managed_server()`) are
answered in the tokenizer's ids with logprob -0.5 each, cut at ``max_tokens`` (finish reason
``length``) as a server would; every answer reports policy version
`STAND_IN_POLICY_VERSION` into the sampling record, as the trainer's vLLM server does.
"""

from __future__ import annotations

import itertools
import re
from typing import Any, Iterator

from atroposlib.envs.server_handling.sampling_record import record_completion, sampling_params
from atroposlib.envs.server_handling.server_harness import (
    ServerHarness,
    create_chat_completion,
    create_completion,
)
from atroposlib.utils.tokenize_for_trainer import token_ids

STAND_IN_POLICY_VERSION = 7
WRONG_ANSWER = "I am not sure, so I will not guess."
GOLD_KEY = re.compile(r"answer|gold|solution|target|label|expected|correct|truth|result", re.IGNORECASE)
NUMBER = re.compile(r"-?\d+(?:\.\d+)?")
SHORT = 64  # longer strings are prompts or passages, not answers
MOST_CANDIDATES = 12
# Each answer is a sentence: environments drop rollouts of fewer than ~10 trained tokens, and
# short budgets (32 tokens, say) must still hold the first ones whole.
THINKING = "<think>\nLet me check it.\n</think>\n"
SHAPES = (
    "So my final answer is \\boxed{{{}}}",
    THINKING + "So my final answer is \\boxed{{{}}}",
    "So my final answer is <answer>{}</answer>",
    "After checking it, the best answer is: {}",
    THINKING + "<answer>{}</answer>",
    "After checking it twice over, the answer is {}",
)


def _leaves(value: Any, key: str = "", depth: int = 0) -> Iterator[tuple[str, Any]]:
    """(key, scalar) pairs of an item, its nested dicts and sequences included."""
    if depth > 3:
        return
    if isinstance(value, dict):
        for name, inner in value.items():
            yield from _leaves(inner, str(name), depth + 1)
    elif isinstance(value, (list, tuple)):
        for inner in value[:20]:
            yield from _leaves(inner, key, depth + 1)
    elif isinstance(value, (str, int, float)) and not isinstance(value, bool):
        yield key, value


def _candidates(item: Any) -> tuple[list[str], list[str]]:
    """(gold answers, other candidate answers) found in `item`."""
    gold: list[str] = []
    other: list[str] = []
    numbers: list[float] = []
    for key, value in _leaves(item):
        text = str(value).strip()
        if isinstance(value, str):
            found = NUMBER.findall(text.split("####")[-1]) if "####" in text else NUMBER.findall(text)
            numbers += [float(n) for n in found[-4:]]
        else:
            numbers.append(float(value))
        if text and len(text) <= SHORT:
            (gold if GOLD_KEY.search(key) else other).append(text)
        elif "####" in text and GOLD_KEY.search(key):
            gold.append(text.split("####")[-1].strip())
    integers = [int(n) for n in numbers if n.is_integer()]
    other += [str(n) for n in dict.fromkeys(integers)]
    other += [str(a + b) for a, b in itertools.combinations(integers[:6], 2)]
    gold = list(dict.fromkeys(gold))
    return gold, [text for text in dict.fromkeys(other) if text not in gold][:MOST_CANDIDATES]


def answers_for(item: Any) -> list[str]:
    """The stand-in's answers while `item` is collected, in order (see the module docstring)."""
    gold, other = _candidates(item)
    answers = [shape.format(text) for text in gold for shape in SHAPES]
    answers += [shape.format(text) for shape in SHAPES for text in other]
    answers.insert(min(1, len(answers)), WRONG_ANSWER)
    return answers


class StandInServer(ServerHarness):
    """A `ServerHarness` whose default answers follow the item being collected."""

    def __init__(self, tokenizer: Any = None) -> None:
        super().__init__(tokenizer)
        self.config = self.config.model_copy(update={"model_name": "stand-in"})
        self.answers: list[str] = [WRONG_ANSWER]
        self.given = 0

    def start_item(self, item: Any) -> None:
        """Answer from `item` from now on, starting at its first answer."""
        self.answers = answers_for(item)
        self.given = 0

    def _texts(self, n: int) -> list[str]:
        texts = [self.answers[(self.given + i) % len(self.answers)] for i in range(n)]
        self.given += n
        return texts

    async def chat_completion(self, **kwargs: Any) -> Any:
        record_completion(sampling_params(kwargs), STAND_IN_POLICY_VERSION)
        return create_chat_completion(self._texts(int(kwargs.get("n") or 1)), n=int(kwargs.get("n") or 1))

    async def completion(self, **kwargs: Any) -> Any:
        record_completion(sampling_params(kwargs), STAND_IN_POLICY_VERSION)
        return create_completion(self._texts(int(kwargs.get("n") or 1)), n=int(kwargs.get("n") or 1))

    async def tokens_and_logprobs_completion(self, **kwargs: Any) -> Any:
        if self.tokenizer is None:
            raise RuntimeError("the stand-in server answers token requests only once it has a tokenizer")
        prompt_ids = list(kwargs.get("input_ids") or token_ids(self.tokenizer.encode(str(kwargs.get("prompt", "")))))
        n, most = int(kwargs.get("n") or 1), int(kwargs.get("max_tokens") or 0)
        answers = [token_ids(self.tokenizer.encode(text, add_special_tokens=False)) or [0] for text in self._texts(n)]
        outputs = [ids[:most] if most > 0 else ids for ids in answers]
        reasons = ["length" if len(cut) < len(ids) else "stop" for cut, ids in zip(outputs, answers)]
        record_completion(sampling_params(kwargs), STAND_IN_POLICY_VERSION)
        return prompt_ids, outputs, [[-0.5] * len(ids) for ids in outputs], reasons
