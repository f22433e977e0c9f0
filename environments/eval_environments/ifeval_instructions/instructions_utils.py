"""Counting helpers of the IFEval checkers: words, sentences, language detection."""

from __future__ import annotations

import re
from typing import Optional

COMPARISON_RELATION = ("less than", "at least")

_WORD = re.compile(r"\w+")
_TOKEN = re.compile(r"\w+(?:'\w+)*|[^\w\s]")
# Abbreviations whose full stop does not end a sentence (lower case, without the final dot).
_ABBREVIATIONS = {
    "mr", "mrs", "ms", "dr", "prof", "sr", "jr", "st", "vs", "etc", "inc", "ltd", "co", "corp", "jan", "feb", "mar",
    "apr", "jun", "jul", "aug", "sep", "sept", "oct", "nov", "dec", "no", "fig", "approx", "dept", "est", "mt", "e.g",
    "i.e", "u.s", "u.k", "a.m", "p.m", "ph.d",
}
_SENTENCE_END = re.compile(r"([.!?]+)([\"')\]]*)(\s+|$)")


def count_words(text: str) -> int:
    """Words as runs of letters, digits and underscores."""
    return len(_WORD.findall(text))


def tokenize(text: str) -> list[str]:
    """Words (with inner apostrophes) and single punctuation marks."""
    return _TOKEN.findall(text)


def split_into_sentences(text: str) -> list[str]:
    """Sentences ending in ``.``, ``!`` or ``?`` (plus closing quotes or brackets) followed by
    whitespace or the end; a full stop after a known abbreviation, a single letter (an
    initial) or inside a number does not end one. Blank lines also end sentences."""
    sentences: list[str] = []
    for block in re.split(r"\n\s*\n", text):
        start = 0
        for found in _SENTENCE_END.finditer(block):
            end = found.end()
            if found.group(1) == "." and found.group(3) and end < len(block):
                before = block[start:found.start()].split()
                last = before[-1].lower().rstrip(".") if before else ""
                if last in _ABBREVIATIONS or (len(last) == 1 and last.isalpha()):
                    continue
            piece = block[start:end].strip()
            if piece:
                sentences.append(piece)
            start = end
        tail = block[start:].strip()
        if tail:
            sentences.append(tail)
    return sentences


def count_sentences(text: str) -> int:
    return len(split_into_sentences(text))


def detect_language(text: str) -> Optional[str]:
    """langdetect's ISO 639-1 code for `text` (deterministic), or None when it cannot tell
    (no letters) or langdetect is not installed (the ``examples`` extra)."""
    try:
        from langdetect import DetectorFactory, LangDetectException, detect
    except ImportError:
        return None
    DetectorFactory.seed = 0
    try:
        return detect(text)
    except LangDetectException:
        return None


def compare(actual: int, relation: str, threshold: int) -> bool:
    """``less than``: actual < threshold; ``at least``: actual >= threshold."""
    if relation == "less than":
        return actual < threshold
    if relation == "at least":
        return actual >= threshold
    raise ValueError(f"relation must be one of {COMPARISON_RELATION}, not {relation!r}")
