"""The quality checks agree with their plain definitions, whatever the masks look like."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from atroposlib.api.group_checks import MASKED, quality_problems
from atroposlib.wire import TOKEN_ID_LIMIT, ScoredData

token_ids = st.integers(-5, TOKEN_ID_LIMIT + 5) | st.sampled_from([0, 7, TOKEN_ID_LIMIT - 1, 2**32, 2**40, -(2**40)])


@st.composite
def sequences(draw: st.DrawFn) -> tuple[list[int], list[int]]:
    tokens = draw(st.lists(token_ids | st.integers(0, 50), min_size=1, max_size=40))
    prompt = draw(st.integers(0, len(tokens)))
    mask = [MASKED] * prompt + tokens[prompt:]
    for _ in range(draw(st.integers(0, 3))):  # multi-turn masking and stray labels
        j = draw(st.integers(0, len(tokens) - 1))
        mask[j] = draw(st.sampled_from([MASKED, 3, -7, 2**33]) | token_ids)
    return tokens, mask


def expected(tokens: list[int], mask: list[int]) -> tuple[int | None, int | None]:
    bad_id = next((j for j, t in enumerate(tokens) if not 0 <= t < TOKEN_ID_LIMIT), None)
    bad_label = next((j for j, (m, t) in enumerate(zip(mask, tokens)) if m not in (MASKED, t)), None)
    return bad_id, bad_label


@settings(max_examples=300, deadline=None)
@given(sequence=sequences())
def test_token_and_label_checks_match_their_definitions(sequence: tuple[list[int], list[int]]) -> None:
    tokens, mask = sequence
    group = ScoredData(tokens=[tokens], masks=[mask], scores=[1.0])
    found = {p.reason: p.field for p in quality_problems(group)}
    bad_id, bad_label = expected(tokens, mask)
    assert found.get("token_id_range") == (None if bad_id is None else f"tokens.0.{bad_id}")
    assert found.get("mask_label") == (None if bad_label is None else f"masks.0.{bad_label}")


def test_aligned_arrays_and_empty_sequences() -> None:
    group = ScoredData(
        tokens=[[1, 2], [], [3]], masks=[[-100, 2], [], [3]], scores=[0, 0, 0],
        advantages=[[0.0, 0.0], [], [0.0, 0.0]], overrides=[{}, {}], distill_token_ids=[[[1], [2]], [], [[3]]],
    )
    assert [(p.reason, p.field) for p in quality_problems(group)] == [
        ("empty_sequence", "tokens.1"), ("aux_length", "advantages.2"), ("aux_length", "overrides"),
    ]
