"""Checking math answers against gold answers with math-verify (atroposlib.utils.math_answers)."""

from __future__ import annotations

from math_verify import verify

from atroposlib.utils.math_answers import (
    answer_matches_gold,
    as_boxed,
    check_math_answer,
    parse_answer,
    parse_gold,
)


def test_as_boxed_wraps_only_unboxed_gold() -> None:
    assert as_boxed("12") == "\\boxed{12}"
    assert as_boxed("\\boxed{12}") == "\\boxed{12}"
    assert as_boxed("so \\boxed{x}") == "so \\boxed{x}"


def test_check_math_answer_outcomes() -> None:
    assert check_math_answer("\\frac{1}{6}", "so it is \\boxed{1/6}") is True
    assert check_math_answer("\\boxed{e^3}", "\\boxed{e^{3}}") is True
    assert check_math_answer("1000", "the total is \\boxed{1000}") is True
    assert check_math_answer("12", "\\boxed{13}") is False
    assert check_math_answer("12", "I could not decide.") is False  # no answer stated
    assert check_math_answer("\\boxed{}", "\\boxed{1}") is None  # the gold holds nothing readable


def test_answer_is_read_from_boxed_or_anchored_latex_only() -> None:
    assert parse_answer("First I tried $3$, then gave up.") == []  # a number met while reasoning
    assert parse_answer("The final answer is $7$")[0] == 7
    assert parse_answer("$3$ first, but \\boxed{5} at last")[0] == 5  # boxed comes first


def test_shorten_equation_chains_keeps_the_last_part() -> None:
    assert str(parse_answer("\\boxed{x = 2 + 3 = 5}", shorten_equation_chains=True)[0]) == "5"
    assert str(parse_answer("\\boxed{x = 2 + 3 = 5}")[0]) != "5"


def test_gold_goes_first_as_math_verify_documents() -> None:
    # verify() is not symmetric: a relation in the gold becomes an interval, one in the
    # answer does not. These pairs tell the two argument orders apart.
    gold, answer = parse_gold("\\boxed{m \\geq \\sqrt{2}}"), parse_answer("\\boxed{[\\sqrt{2}, \\infty)}")
    assert verify(gold, answer) and not verify(answer, gold)
    assert answer_matches_gold(gold, answer) is True
    assert check_math_answer("m \\geq \\sqrt{2}", "\\boxed{[\\sqrt{2}, \\infty)}") is True

    gold, answer = parse_gold("\\boxed{(1, 2)}"), parse_answer("\\boxed{1 < x < 2}")
    assert verify(answer, gold) and not verify(gold, answer)
    assert answer_matches_gold(gold, answer) is False
    assert check_math_answer("(1, 2)", "\\boxed{1 < x < 2}") is False
