"""Linear length penalties (atroposlib.utils.length_penalty)."""

from __future__ import annotations

import pytest

from atroposlib.utils.length_penalty import length_overrun, length_scaled_score


def test_overrun_is_zero_in_the_free_part_then_linear_then_capped() -> None:
    assert length_overrun(0, 100, 0.5) == 0.0
    assert length_overrun(50, 100, 0.5) == 0.0  # the threshold itself is still free
    assert length_overrun(75, 100, 0.5) == pytest.approx(0.5)
    assert length_overrun(100, 100, 0.5) == 1.0
    assert length_overrun(250, 100, 0.5) == 1.0  # past the budget: capped


def test_start_fraction_zero_penalises_every_token() -> None:
    assert [length_overrun(n, 8, 0.0) for n in (0, 2, 8, 9)] == [0.0, 0.25, 1.0, 1.0]


def test_a_zone_narrower_than_one_token_does_not_divide_by_zero() -> None:
    assert length_overrun(100, 100, 1.0) == 0.0
    assert length_overrun(101, 100, 1.0) == 1.0  # zone taken as one token wide
    assert length_overrun(3, 0, 0.5) == 1.0  # no budget at all


def test_length_scaled_score_scales_any_score() -> None:
    assert length_scaled_score(1.0, 40, 100, 0.75) == 1.0
    assert length_scaled_score(1.0, 90, 100, 0.75) == pytest.approx(0.4)
    assert length_scaled_score(0.5, 90, 100, 0.75) == pytest.approx(0.2)
    assert length_scaled_score(-1.0, 90, 100, 0.75) == pytest.approx(-0.4)  # towards 0 as well
    assert length_scaled_score(1.0, 100, 100, 0.75) == 0.0
