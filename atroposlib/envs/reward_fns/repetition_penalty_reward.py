"""`RepetitionPenaltyReward` (``repetitionpenalty``): a penalty for repetitive text.

Scores are 0 (fine) down to -1 (very repetitive):

* texts shorter than `min_words` words or `min_sentences` sentences get `short_text_penalty`;
* repeated sentences (more than 3 words) get ``base - 0.4 x min(1, repeats / sentences)``;
* otherwise a repetition score ``s`` is the weighted sum (capped at 1) of four components,
  each in [0, 1]: *word* (occurrences beyond the second of content words: > 3 letters, not
  stopwords, per content word), *phrase* (extra occurrences of 3- to 5-word n-grams,
  weighted n/3, per n-gram), *consecutive* (immediately repeated words, per word) and
  *beginning* (sentences starting with an already used word, per sentence); ``s <=
  threshold`` scores 0, else ``min(-0.1, -min(1, (s - threshold) / (1 - threshold)))``.
"""

from __future__ import annotations

import re
from collections import Counter
from typing import Any, Optional

from atroposlib.envs.reward_fns.registry import registry
from atroposlib.envs.reward_fns.reward_function import RewardFunction

DEFAULT_COMPONENT_WEIGHTS = {"word": 0.3, "phrase": 0.4, "consecutive": 0.6, "beginning": 0.5}
DEFAULT_STOPWORDS = frozenset(
    "the a an and or but if then than that this these those with from into onto over under about above below "
    "for of to in on at by as is are was were be been being have has had do does did will would shall should "
    "can could may might must not no yes it its they them their there here what which who whom whose when where "
    "why how all any each some such more most other only own same very just also".split()
)


def _sentences(text: str) -> list[str]:
    return [s.strip() for s in re.split(r"[.!?]+", text) if s.strip()]


def _words(text: str) -> list[str]:
    return re.findall(r"[a-z0-9']+", text.lower())


@registry.register
class RepetitionPenaltyReward(RewardFunction):
    """0 for varied text, down to -1 for heavily repeated words, phrases or sentences."""

    def __init__(self, threshold: float = 0.05, min_words: int = 10, min_sentences: int = 2,
                 short_text_penalty: float = -0.1, paragraph_repetition_base_penalty: float = -0.6,
                 component_weights: Optional[dict[str, float]] = None, stopwords: Optional[list[str]] = None,
                 weight: float = 1.0, **kwargs: Any) -> None:
        super().__init__(weight=weight, **kwargs)
        self.threshold, self.min_words, self.min_sentences = threshold, min_words, min_sentences
        self.short_text_penalty = short_text_penalty
        self.base_penalty = paragraph_repetition_base_penalty
        self.component_weights = component_weights or DEFAULT_COMPONENT_WEIGHTS
        self.stopwords = frozenset(stopwords) if stopwords is not None else DEFAULT_STOPWORDS

    def score_text(self, text: str) -> float:
        words, sentences = _words(text), _sentences(text)
        if len(words) < self.min_words or len(sentences) < self.min_sentences:
            return self.short_text_penalty
        long_sentences = [" ".join(_words(s)) for s in sentences if len(_words(s)) > 3]
        repeats = len(long_sentences) - len(set(long_sentences))
        if repeats > 0:
            return self.base_penalty - 0.4 * min(1.0, repeats / len(sentences))
        score = min(1.0, sum(self.component_weights.get(name, 0.0) * value
                             for name, value in self._components(words, sentences).items()))
        if score <= self.threshold:
            return 0.0
        return min(-0.1, -min(1.0, (score - self.threshold) / (1 - self.threshold)))

    def _components(self, words: list[str], sentences: list[str]) -> dict[str, float]:
        content = [w for w in words if len(w) > 3 and w not in self.stopwords]
        extra_words = sum(c - 2 for c in Counter(content).values() if c > 2)
        phrase, ngram_total = 0.0, 0
        for n in range(3, 6):
            grams = Counter(tuple(words[i:i + n]) for i in range(len(words) - n + 1))
            ngram_total += sum(grams.values())
            phrase += sum((c - 1) * n / 3 for c in grams.values() if c > 1)
        consecutive = sum(1 for a, b in zip(words, words[1:]) if a == b)
        openings = [(_words(s) or [""])[0] for s in sentences]
        return {
            "word": min(1.0, extra_words / len(content)) if content else 0.0,
            "phrase": min(1.0, phrase / ngram_total) if ngram_total else 0.0,
            "consecutive": min(1.0, consecutive / len(words)),
            "beginning": (len(openings) - len(set(openings))) / len(openings),
        }

    def compute(self, completions: list[Any], **kwargs: Any) -> list[float]:
        return [self.score_text(self.get_content(c)) for c in completions]


def repetition_penalty_reward(completions: list[Any], **kwargs: Any) -> list[float]:
    return RepetitionPenaltyReward().compute(completions, **kwargs)
