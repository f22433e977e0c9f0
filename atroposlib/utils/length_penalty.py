"""Linear length penalties: rewards that shrink as a completion uses up its token budget.

The *overrun* of a completion is how far it has gone into the penalised zone of its
budget: 0.0 up to ``start_fraction * max_length`` tokens, then rising linearly to 1.0 at
``max_length`` tokens and staying 1.0 beyond it. ``start_fraction=0`` penalises every token
(a pure brevity reward); ``start_fraction=0.5`` leaves the first half of the budget free.

Environments apply it when a whole group is right, so that the group still carries a
signal (the shorter right answers) instead of being dropped for having equal scores.
Scaling (`length_scaled_score`) is the usual shape; an environment that subtracts instead
uses `length_overrun` directly.
"""

from __future__ import annotations


def length_overrun(length: int, max_length: int, start_fraction: float) -> float:
    """How far `length` tokens run into the penalised zone, from 0.0 to 1.0.

    0.0 while ``length <= start_fraction * max_length``; then linear, reaching 1.0 at
    `max_length` and capped there. The zone is taken to be at least one token wide, so a
    `start_fraction` of 1.0 (or a budget under one token) does not divide by zero: any
    completion past the threshold is then fully penalised.
    """
    threshold = start_fraction * max_length
    if length <= threshold:
        return 0.0
    return min(1.0, (length - threshold) / max(1.0, max_length - threshold))


def length_scaled_score(score: float, length: int, max_length: int, start_fraction: float) -> float:
    """`score` scaled by ``1 - length_overrun(...)``: unchanged inside the free part of the
    budget, falling linearly to 0.0 at `max_length` (a negative score moves towards 0.0 too)."""
    return score * (1.0 - length_overrun(length, max_length, start_fraction))


def all_right_length_scaled(scores: list[float], tokens: list[list[int]], max_length: int,
                            start_fraction: float) -> list[float]:
    """A group's scores with `length_scaled_score` applied when every rollout scored 1.0 (all
    right: the shorter answers are preferred), unchanged otherwise."""
    if not all(score == 1.0 for score in scores):
        return scores
    return [length_scaled_score(score, len(ids), max_length, start_fraction) for score, ids in zip(scores, tokens)]
