"""Returns, advantages and best-of-n selection."""

from __future__ import annotations

import numpy as np
import pytest

from atroposlib.utils.advantages import (
    allclose_to_first,
    compute_discounted_returns,
    compute_grpo_process_supervision_advantages,
    compute_stats,
)
from atroposlib.utils.best_of_n_selection import select_best_index


def test_allclose_to_first() -> None:
    assert allclose_to_first([[1, 2], [1, 2]]) is True
    assert list(allclose_to_first([[1, 2], [1, 3], [1, 2]], return_vector=True)) == [True, False, True]


def test_compute_stats_on_jagged_lists() -> None:
    stats = compute_stats([[1, 2], [3], [[4]]])
    assert stats["mean"] == 2.5 and stats["var"] == pytest.approx(1.25)
    with pytest.raises(ValueError):
        compute_stats([["a"]])
    with pytest.raises(ValueError):
        compute_stats([[]])


def test_discounted_returns() -> None:
    assert np.allclose(compute_discounted_returns([1, 0, 2], 0.5), [1.5, 1.0, 2.0])


def test_process_supervision_advantages() -> None:
    advantages = compute_grpo_process_supervision_advantages([[1, 0], [0, 1]])
    z = 1.0  # rewards {1,0,0,1}: mean 0.5, std 0.5 -> +-1
    assert np.allclose(advantages[0], [z - z, -z]) and np.allclose(advantages[1], [0, z])
    with pytest.raises(ValueError):
        compute_grpo_process_supervision_advantages([[1, 1], [1]])


def test_best_of_n() -> None:
    assert select_best_index([1, 3, 3], [5, 9, 2]) == 2
    assert select_best_index([1, 3, 3], [5, 2, 2]) == 1
    assert select_best_index([3, 1], [0, 0], primary_higher_is_better=False) == 1
    with pytest.raises(ValueError):
        select_best_index([], [])
