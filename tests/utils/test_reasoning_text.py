"""Reading ``<think>`` blocks and the answer after them (atroposlib.utils.reasoning_text)."""

from __future__ import annotations

import pytest

from atroposlib.utils.reasoning_text import (
    THINK_CLOSE,
    THINK_OPEN,
    text_after_single_think_block,
    text_after_thinking,
    thinking_content,
)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("<think>a</think> answer ", " answer "),  # unstripped
        ("no tags at all", "no tags at all"),  # no reasoning: the whole reply is the answer
        ("<think>never closed \\boxed{1}", "<think>never closed \\boxed{1}"),  # unclosed: whole reply
        ("pre-filled open tag</think>\n42", "\n42"),  # the template wrote <think>
        ("<think>a</think>b<think>c</think>d", "d"),  # several: after the last
        ("<THINK>a</Think>B", "B"),  # tags match whatever their case
        ("<think>a</think>", ""),
        ("", ""),
        (None, ""),
    ],
)
def test_text_after_thinking_is_lenient(text: str | None, expected: str) -> None:
    assert text_after_thinking(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("<think>a</think> answer ", " answer "),  # unstripped
        ("\n<think>\nreason\n</think>", ""),  # an empty answer is still an answer
        ("before <think>a</think>after", "after"),  # text before the block is allowed
        ("<Think>a</THINK>B", "B"),  # any case
        ("no tags", None),
        ("pre-filled</think>42", None),  # no opening tag
        ("<think>never closed", None),
        ("</think>x<think>y", None),  # reversed
        ("<think>a</think><think>b</think>c", None),  # two blocks
        ("<think>a</think>c</think>", None),  # a stray closing tag
        ("<think><think>a</think>c", None),  # a stray opening tag
        ("<think>a</think>c<THINK>", None),  # a stray tag in another case still counts
        (None, None),
    ],
)
def test_text_after_single_think_block_is_strict(text: str | None, expected: str | None) -> None:
    assert text_after_single_think_block(text) == expected


def test_thinking_content_reads_the_first_complete_block() -> None:
    assert thinking_content("x<think> idea </think>y<think>later</think>") == " idea "  # unstripped
    assert thinking_content("<THINK>\nup\n</THINK>") == "\nup\n"
    assert thinking_content("<think></think>answer") == ""  # empty, not missing
    assert thinking_content("<think>never closed") is None
    assert thinking_content("no block") is None
    assert thinking_content(None) is None


def test_tag_patterns_ignore_case() -> None:
    assert THINK_OPEN.findall("<think><THINK><Think>") == ["<think>", "<THINK>", "<Think>"]
    assert len(THINK_CLOSE.findall("</think></THINK><think>")) == 2
