"""`ChandasMeterReward` (``chandasmeter``): does a Sanskrit verse (IAST) scan in the target meter?

With the optional ``chandas`` package exposing a ``Classifier``, the verse is transliterated
to SLP1 and classified: a prediction of the target meter scores the classifier's
confidence, any other meter ``1 - confidence``. Without it (the package on PyPI does not
currently import), a built-in scansion is used: the verse is split into pādas (lines, or
halves of lines separated by daṇḍas) and the score is the share of pādas whose syllable
count is the meter's (gāyatrī/anuṣṭubh 8, triṣṭubh 11, jagatī 12).
"""

from __future__ import annotations

import logging
import re
import unicodedata
from typing import Any, Optional

from atroposlib.envs.reward_fns.registry import registry
from atroposlib.envs.reward_fns.reward_function import RewardFunction

log = logging.getLogger("atroposlib.rewards")

SYLLABLES_PER_PADA = {"gayatri": 8, "anushtubh": 8, "anustubh": 8, "tristubh": 11, "trishtubh": 11, "jagati": 12}
# Diphthongs first, so each is one nucleus. ḷ is left out: in Vedic texts it is mostly the
# retroflex consonant (īḷe), and vocalic ḷ is very rare.
VOWEL_NUCLEUS = re.compile(r"ai|au|[aāiīuūṛṝeo]", re.IGNORECASE)
PADA_SEPARATORS = re.compile(r"[\n|।॥]+")
IAST_TO_SLP1 = [("ai", "E"), ("au", "O"), ("kh", "K"), ("gh", "G"), ("ch", "C"), ("jh", "J"), ("ṭh", "W"),
                ("ḍh", "Q"), ("th", "T"), ("dh", "D"), ("ph", "P"), ("bh", "B"), ("ā", "A"), ("ī", "I"),
                ("ū", "U"), ("ṛ", "f"), ("ṝ", "F"), ("ḷ", "x"), ("ḹ", "X"), ("ṅ", "N"), ("ñ", "Y"), ("ṭ", "w"),
                ("ḍ", "q"), ("ṇ", "R"), ("ś", "S"), ("ṣ", "z"), ("ṃ", "M"), ("ḥ", "H")]


VEDIC_ACCENTS = {"\u0300", "\u0301", "\u0302"}


def without_accents(text: str) -> str:
    """`text` without Vedic pitch accents (á, ā́, ì...), keeping IAST's macrons and dots."""
    return unicodedata.normalize("NFC", "".join(
        ch for ch in unicodedata.normalize("NFD", text) if ch not in VEDIC_ACCENTS))


def iast_to_slp1(text: str) -> str:
    """Transliterate IAST to SLP1 (one ASCII letter per Sanskrit sound)."""
    result = without_accents(text).lower()
    for iast, slp1 in IAST_TO_SLP1:
        result = result.replace(iast, slp1)
    return result


def syllable_count(text: str) -> int:
    return len(VOWEL_NUCLEUS.findall(without_accents(text)))


def padas(verse: str, per_pada: int) -> list[str]:
    """The verse's pādas: its daṇḍa/line segments, a segment twice the pāda length split in two."""
    result: list[str] = []
    for segment in filter(str.strip, PADA_SEPARATORS.split(verse)):
        words = segment.split()
        if syllable_count(segment) == 2 * per_pada:
            running, half = 0, len(words)
            for index, word in enumerate(words):
                running += syllable_count(word)
                if running >= per_pada:
                    half = index + 1
                    break
            result += [" ".join(words[:half]), " ".join(words[half:])]
        else:
            result.append(segment)
    return result


def scansion_score(verse: str, meter: str) -> float:
    """Share of pādas with the meter's syllable count (0 for an unknown meter or empty verse)."""
    per_pada = SYLLABLES_PER_PADA.get(meter.lower())
    lines = padas(verse, per_pada) if per_pada else []
    if not lines:
        return 0.0
    return sum(syllable_count(line) == per_pada for line in lines) / len(lines)


def _chandas_classifier() -> Optional[Any]:
    try:
        from chandas import Classifier  # type: ignore[attr-defined]

        return Classifier()
    except Exception as exc:  # absent, or present but broken: the built-in scansion takes over
        log.info("chandas classifier unavailable (%s); using the built-in syllable scansion", exc)
        return None


@registry.register
class ChandasMeterReward(RewardFunction):
    """How well each completion scans in `meter` (see the module docstring), in [0, 1]."""

    def __init__(self, meter: str = "tristubh", weight: float = 1.0, **kwargs: Any) -> None:
        super().__init__(weight=weight, **kwargs)
        self.meter = meter
        self.classifier = _chandas_classifier()

    def _classified(self, text: str) -> float:
        result = self.classifier.classify(iast_to_slp1(text))
        predicted = str(getattr(result, "meter", result) or "").lower()
        confidence = float(getattr(result, "score", 1.0))
        score = confidence if predicted == self.meter.lower() else 1.0 - confidence
        return max(0.0, min(1.0, score))

    def compute(self, completions: list[Any], **kwargs: Any) -> list[float]:
        texts = [self.get_content(c) for c in completions]
        if self.classifier is not None:
            return [self._classified(text) for text in texts]
        return [scansion_score(text, self.meter) for text in texts]
