"""Choosing the best of n candidates by a primary score, ties broken by a secondary one."""

from __future__ import annotations

from typing import Sequence


def select_best_index(
    primary_scores: Sequence[float],
    secondary_scores: Sequence[float],
    primary_higher_is_better: bool = True,
    secondary_lower_is_better: bool = True,
) -> int:
    """Index of the best candidate; on equal primaries the better secondary wins, and on a
    full tie the earlier candidate."""
    if not primary_scores or len(primary_scores) != len(secondary_scores):
        raise ValueError("need the same, non-zero number of primary and secondary scores")
    best = 0
    for i in range(1, len(primary_scores)):
        primary, best_primary = primary_scores[i], primary_scores[best]
        better_primary = primary > best_primary if primary_higher_is_better else primary < best_primary
        if better_primary:
            best = i
        elif primary == best_primary:
            secondary, best_secondary = secondary_scores[i], secondary_scores[best]
            if (secondary < best_secondary) if secondary_lower_is_better else (secondary > best_secondary):
                best = i
    return best
