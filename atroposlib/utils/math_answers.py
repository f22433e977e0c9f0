"""Whether a model's mathematical answer equals a gold answer, checked with math-verify.

The *gold* answer is the dataset's reference; the *answer* is the model's text. The two are
handled differently on purpose:

* The gold is trusted LaTeX. `check_math_answer` wraps it in ``\\boxed{}`` (`as_boxed`) so
  that math-verify reads it whole, and `parse_gold` accepts any LaTeX in it.
* The answer is untrusted prose. `parse_answer` reads ``\\boxed{}`` first and otherwise only
  LaTeX that follows an answer anchor ("the final answer is ..."), so a number met while
  reasoning is not taken for the answer; units are dropped and ``\\boxed{}`` contents kept.

math-verify's ``verify(gold, target)`` is not symmetric: its documentation asks for the gold
first, because assignments and relations in the gold are converted (``x = 5`` to ``5``,
``1 < x < 2`` to an interval) while those in the answer are not. With gold
``m \\geq \\sqrt{2}`` the answer ``[\\sqrt{2}, \\infty)`` is right, but with the arguments
swapped it is not. `answer_matches_gold` is the one place that calls ``verify``, gold first.
"""

from __future__ import annotations

from typing import Any, List, Optional

from latex2sympy2_extended import NormalizationConfig
from math_verify import LatexExtractionConfig, parse, verify


def as_boxed(gold: str) -> str:
    """`gold` inside ``\\boxed{}``, unless it already contains a ``\\boxed``."""
    return gold if "\\boxed" in gold else "\\boxed{" + gold + "}"


def parse_gold(gold: str) -> List[Any]:
    """math-verify's reading of a gold answer (the first LaTeX expression found, anchored or
    not); ``[]`` when it holds none."""
    return parse(gold, extraction_mode="first_match", extraction_config=[LatexExtractionConfig()])


def parse_answer(text: str, shorten_equation_chains: bool = False) -> List[Any]:
    """math-verify's reading of a model's answer; ``[]`` when it states none.

    ``\\boxed{}`` contents come first; other LaTeX counts only after an answer anchor.
    `shorten_equation_chains` turns on math-verify's deprecated ``equations`` normalisation:
    a chain ``a = b = c`` written without commas or semicolons is read as its last part. The
    evaluation environments keep it for parity with Atropos's; training scorers leave it off.
    """
    config = LatexExtractionConfig(
        normalization_config=NormalizationConfig(
            nits=False, malformed_operators=False, basic_latex=True, equations=shorten_equation_chains,
            boxed="all", units=True,
        ),
        boxed_match_priority=0,
        try_extract_without_anchor=False,
    )
    return parse(text, extraction_mode="first_match", extraction_config=[config])


def answer_matches_gold(gold_parsed: List[Any], answer_parsed: List[Any]) -> bool:
    """math-verify's verdict on two parsed answers, with the gold passed first as its
    documentation requires (see the module docstring)."""
    return bool(verify(gold_parsed, answer_parsed))


def check_math_answer(gold: str, answer_text: str) -> Optional[bool]:
    """Whether `answer_text` states `gold`: True or False, or None when undecidable.

    None when the gold (boxed with `as_boxed`) holds no expression math-verify can read, or
    when math-verify fails; False when the answer states nothing readable or something else.
    math-verify's time limits use signals, so call this in a process's main thread.
    """
    try:
        gold_parsed = parse_gold(as_boxed(gold))
        if not gold_parsed:
            return None
        answer_parsed = parse_answer(answer_text)
        return bool(answer_parsed) and answer_matches_gold(gold_parsed, answer_parsed)
    except Exception:  # noqa: BLE001 - a parser or verifier failure leaves the answer undecided
        return None
