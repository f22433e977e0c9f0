"""`AccuracyReward` (``accuracy``): is the final answer mathematically equal to the gold one?"""

from __future__ import annotations

import re
from typing import Any, Optional

from atroposlib.envs.reward_fns.registry import registry
from atroposlib.envs.reward_fns.reward_function import RewardFunction

NUMBER = r"-?\d+(?:\.\d+)?"


def answer_part(text: str, split_on_think_tag: bool) -> str:
    return text.rsplit("</think>", 1)[-1] if split_on_think_tag and "</think>" in text else text


def _numeric_fallback(answer: str, gold: str, tolerance: float) -> bool:
    try:
        target = float(gold.replace(",", ""))
    except ValueError:
        return False
    found = re.search(r"\\boxed\{\s*(" + NUMBER + r")\s*\}", answer) or re.search(r"####\s*(" + NUMBER + ")", answer)
    return bool(found) and abs(float(found.group(1)) - target) <= tolerance


def is_correct(answer: str, gold: str, tolerance: float) -> bool:
    from math_verify import LatexExtractionConfig, parse, verify

    gold = gold.split("####", 1)[1].strip() if "####" in gold else gold.strip()
    parsed_gold = parse(f"\\boxed{{{gold}}}", extraction_config=[LatexExtractionConfig()])
    parsed_answer = parse(answer, extraction_config=[
        LatexExtractionConfig(boxed_match_priority=0, try_extract_without_anchor=False)])
    if parsed_gold and parsed_answer and verify(parsed_gold, parsed_answer):
        return True
    return _numeric_fallback(answer, gold, tolerance)


@registry.register
class AccuracyReward(RewardFunction):
    """1.0 when the answer (after ``</think>``) verifies against ``ground_truth`` /
    ``solution`` with math-verify (numeric fallback within `tolerance`), else 0.0."""

    def __init__(self, tolerance: float = 1e-6, split_on_think_tag: bool = True, max_boxed_threshold: int = 6,
                 weight: float = 1.0, **kwargs: Any) -> None:
        super().__init__(weight=weight, **kwargs)
        self.tolerance = tolerance
        self.split_on_think_tag = split_on_think_tag
        self.max_boxed_threshold = max_boxed_threshold

    def compute(self, completions: list[Any], solution: Any = None, ground_truth: Any = None, **kwargs: Any) -> list[float]:
        gold: Optional[Any] = ground_truth if ground_truth is not None else solution
        if gold is None:
            return [0.0] * len(completions)
        golds = gold if isinstance(gold, list) else [gold] * len(completions)
        scores = []
        for completion, expected in zip(completions, golds):
            answer = answer_part(self.get_content(completion), self.split_on_think_tag)
            if answer.count("\\boxed") > self.max_boxed_threshold:
                scores.append(0.0)
                continue
            scores.append(1.0 if is_correct(answer, str(expected), self.tolerance) else 0.0)
        return scores


def accuracy_reward(completions: list[Any], solution: Any = None, **kwargs: Any) -> list[float]:
    return AccuracyReward().compute(completions, solution=solution, **kwargs)
