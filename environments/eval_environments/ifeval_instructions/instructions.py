"""The checkers of IFEval's instructions (``google/IFEval``'s ``instruction_id_list``).

Each checker is built from the row's ``kwargs`` (`build_description(**kwargs)`, which
returns the instruction in words) and tells whether a response follows it
(`check_following`). The rules are IFEval's: relations are ``less than`` / ``at least``,
paragraphs are separated by ``***`` (or by blank lines for the nth-paragraph rule), a
language that cannot be detected counts as followed.
"""

from __future__ import annotations

import collections
import json
import re
from typing import Any, Optional

from . import instructions_utils as utils

CONSTRAINED_RESPONSE_OPTIONS = ("My answer is yes.", "My answer is no.", "My answer is maybe.")


class Instruction:
    """One verifiable instruction; subclasses list their arguments in `arguments`."""

    arguments: tuple[str, ...] = ()

    def __init__(self, instruction_id: str) -> None:
        self.id = instruction_id
        self.args: dict[str, Any] = {}

    def build_description(self, **kwargs: Any) -> str:
        """Take the arguments (unknown ones ignored, None means unset); the instruction in words."""
        self.args.update({key: value for key, value in kwargs.items() if key in self.arguments and value is not None})
        self.prepare()
        return self.describe()

    def prepare(self) -> None:
        """Normalise `args` after `build_description` (override)."""

    def describe(self) -> str:
        return f"{self.id} {self.args}"

    def get_instruction_args(self) -> Optional[dict[str, Any]]:
        return dict(self.args) if self.arguments else None

    def get_instruction_args_keys(self) -> list[str]:
        return list(self.arguments)

    def check_following(self, value: str) -> bool:
        raise NotImplementedError


# -- keywords ---------------------------------------------------------------------------------


class KeywordChecker(Instruction):
    arguments = ("keywords",)

    def describe(self) -> str:
        return f"Include keywords {', '.join(self.args.get('keywords', []))} in the response."

    def check_following(self, value: str) -> bool:
        return all(re.search(re.escape(word), value, re.IGNORECASE) for word in self.args.get("keywords", []))


class KeywordFrequencyChecker(Instruction):
    arguments = ("keyword", "frequency", "relation")

    def describe(self) -> str:
        return f"In your response, the word {self.args['keyword']} should appear {self.args['relation']} {self.args['frequency']} times."

    def check_following(self, value: str) -> bool:
        count = len(re.findall(re.escape(self.args["keyword"].strip()), value, re.IGNORECASE))
        return utils.compare(count, self.args["relation"], int(self.args["frequency"]))


class ForbiddenWords(Instruction):
    arguments = ("forbidden_words",)

    def describe(self) -> str:
        return f"Do not include keywords {', '.join(self.args.get('forbidden_words', []))} in the response."

    def check_following(self, value: str) -> bool:
        return not any(re.search(r"\b" + re.escape(word) + r"\b", value, re.IGNORECASE)
                       for word in self.args.get("forbidden_words", []))


class LetterFrequencyChecker(Instruction):
    arguments = ("letter", "let_frequency", "let_relation")

    def prepare(self) -> None:
        self.args["letter"] = str(self.args.get("letter", "")).strip().lower()

    def describe(self) -> str:
        return f"The letter {self.args['letter']} should appear {self.args['let_relation']} {self.args['let_frequency']} times."

    def check_following(self, value: str) -> bool:
        count = collections.Counter(value.lower())[self.args["letter"]]
        return utils.compare(count, self.args["let_relation"], int(self.args["let_frequency"]))


# -- language and length ----------------------------------------------------------------------


class ResponseLanguageChecker(Instruction):
    arguments = ("language",)

    def describe(self) -> str:
        return f"Your entire response should be in the language {self.args['language']}, no other language is allowed."

    def check_following(self, value: str) -> bool:
        found = utils.detect_language(value)
        return found is None or found == self.args["language"]


class NumberOfSentences(Instruction):
    arguments = ("num_sentences", "relation")

    def describe(self) -> str:
        return f"Your response should contain {self.args['relation']} {self.args['num_sentences']} sentences."

    def check_following(self, value: str) -> bool:
        return utils.compare(utils.count_sentences(value), self.args["relation"], int(self.args["num_sentences"]))


class ParagraphChecker(Instruction):
    arguments = ("num_paragraphs",)

    def describe(self) -> str:
        return f"There should be {self.args['num_paragraphs']} paragraphs, separated with the markdown divider ***."

    def check_following(self, value: str) -> bool:
        parts = re.split(r"\s?\*\*\*\s?", value)
        count = len(parts)
        for index, part in enumerate(parts):
            if not part.strip():
                if 0 < index < len(parts) - 1:
                    return False  # an empty paragraph between two dividers
                count -= 1
        return count == int(self.args["num_paragraphs"])


class NumberOfWords(Instruction):
    arguments = ("num_words", "relation")

    def describe(self) -> str:
        return f"Answer with {self.args['relation']} {self.args['num_words']} words."

    def check_following(self, value: str) -> bool:
        return utils.compare(utils.count_words(value), self.args["relation"], int(self.args["num_words"]))


class ParagraphFirstWordCheck(Instruction):
    arguments = ("num_paragraphs", "nth_paragraph", "first_word")

    def prepare(self) -> None:
        self.args["first_word"] = str(self.args.get("first_word", "")).lower()

    def describe(self) -> str:
        return (f"There should be {self.args['num_paragraphs']} paragraphs separated by blank lines; paragraph "
                f"{self.args['nth_paragraph']} must start with the word {self.args['first_word']}.")

    def check_following(self, value: str) -> bool:
        paragraphs = value.split("\n\n")
        count = sum(1 for paragraph in paragraphs if paragraph.strip())
        nth = int(self.args["nth_paragraph"])
        if not 1 <= nth <= count or nth > len(paragraphs):
            return False
        paragraph = paragraphs[nth - 1].strip()
        if not paragraph:
            return False
        word = paragraph.split()[0].strip().lstrip("'\"")
        first = re.match(r"[^.,?!'\"]*", word).group(0).lower()
        return count == int(self.args["num_paragraphs"]) and first == self.args["first_word"]


# -- detectable content and format -------------------------------------------------------------


class PlaceholderChecker(Instruction):
    arguments = ("num_placeholders",)

    def describe(self) -> str:
        return f"The response must contain at least {self.args['num_placeholders']} placeholders in square brackets, such as [address]."

    def check_following(self, value: str) -> bool:
        return len(re.findall(r"\[.*?\]", value)) >= int(self.args["num_placeholders"])


class PostscriptChecker(Instruction):
    arguments = ("postscript_marker",)

    def describe(self) -> str:
        return f"At the end of your response, please explicitly add a postscript starting with {self.args['postscript_marker']}."

    def check_following(self, value: str) -> bool:
        marker = str(self.args["postscript_marker"]).strip()
        if marker == "P.P.S":
            pattern = r"\s*p\.\s?p\.\s?s.*$"
        elif marker == "P.S.":
            pattern = r"\s*p\.\s?s\..*$"
        else:
            pattern = r"\s*" + re.escape(marker.lower()) + r".*$"
        return bool(re.findall(pattern, value.lower(), re.MULTILINE))


class BulletListChecker(Instruction):
    arguments = ("num_bullets",)

    def describe(self) -> str:
        return f"Your answer must contain exactly {self.args['num_bullets']} markdown bullet points such as: * point."

    def check_following(self, value: str) -> bool:
        stars = re.findall(r"^\s*\*[^*].*$", value, re.MULTILINE)
        dashes = re.findall(r"^\s*-.*$", value, re.MULTILINE)
        return len(stars) + len(dashes) == int(self.args["num_bullets"])


class ConstrainedResponseChecker(Instruction):
    def describe(self) -> str:
        return f"Answer with one of the following options: {', '.join(CONSTRAINED_RESPONSE_OPTIONS)}"

    def check_following(self, value: str) -> bool:
        return any(option in value.strip() for option in CONSTRAINED_RESPONSE_OPTIONS)


class HighlightSectionChecker(Instruction):
    arguments = ("num_highlights",)

    def describe(self) -> str:
        return f"Highlight at least {self.args['num_highlights']} sections with markdown, i.e. *highlighted section*."

    def check_following(self, value: str) -> bool:
        single = [h for h in re.findall(r"\*[^\n*]*\*", value) if h.strip("*").strip()]
        double = [h for h in re.findall(r"\*\*[^\n*]*\*\*", value) if h[2:-2].strip()]
        return len(single) + len(double) >= int(self.args["num_highlights"])


class SectionChecker(Instruction):
    arguments = ("section_spliter", "num_sections")

    def describe(self) -> str:
        return f"Your response must have {self.args['num_sections']} sections, each beginning with {self.args['section_spliter']} X."

    def check_following(self, value: str) -> bool:
        pattern = r"\s?" + re.escape(str(self.args["section_spliter"]).strip()) + r"\s?\d+\s?"
        return len(re.split(pattern, value)) - 1 >= int(self.args["num_sections"])


class JsonFormat(Instruction):
    def describe(self) -> str:
        return "Entire output should be wrapped in JSON format; markdown ticks such as ``` may be used."

    def check_following(self, value: str) -> bool:
        text = value.strip()
        for fence in ("```json", "```Json", "```JSON", "```"):
            if text.startswith(fence):
                text = text[len(fence):]
                break
        text = text[:-3] if text.endswith("```") else text
        try:
            json.loads(text.strip())
        except ValueError:
            return False
        return True


class TitleChecker(Instruction):
    def describe(self) -> str:
        return "Your answer must contain a title, wrapped in double angular brackets, such as <<poem of joy>>."

    def check_following(self, value: str) -> bool:
        return any(title[2:-2].strip() for title in re.findall(r"<<[^\n]+>>", value))


# -- combinations, start/end, case, punctuation ------------------------------------------------


class TwoResponsesChecker(Instruction):
    def describe(self) -> str:
        return "Give two different responses, separated by 6 asterisk symbols: ******."

    def check_following(self, value: str) -> bool:
        parts = value.split("******")
        kept = []
        for index, part in enumerate(parts):
            if part.strip():
                kept.append(part.strip())
            elif 0 < index < len(parts) - 1:
                return False
        return len(kept) == 2 and kept[0] != kept[1]


class RepeatPromptThenAnswer(Instruction):
    arguments = ("prompt_to_repeat",)

    def describe(self) -> str:
        return f"First repeat the request word for word without change, then give your answer: {self.args['prompt_to_repeat']}"

    def check_following(self, value: str) -> bool:
        return value.strip().lower().startswith(str(self.args["prompt_to_repeat"]).strip().lower())


class EndChecker(Instruction):
    arguments = ("end_phrase",)

    def describe(self) -> str:
        return f"Finish your response with this exact phrase {self.args['end_phrase']}. No other words should follow this phrase."

    def check_following(self, value: str) -> bool:
        return value.strip().strip('"').lower().endswith(str(self.args["end_phrase"]).strip().lower())


class QuotationChecker(Instruction):
    def describe(self) -> str:
        return "Wrap your entire response with double quotation marks."

    def check_following(self, value: str) -> bool:
        text = value.strip()
        return len(text) > 1 and text[0] == '"' and text[-1] == '"'


class CapitalWordFrequencyChecker(Instruction):
    arguments = ("capital_frequency", "capital_relation")

    def describe(self) -> str:
        return (f"In your response, words with all capital letters should appear {self.args['capital_relation']} "
                f"{self.args['capital_frequency']} times.")

    def check_following(self, value: str) -> bool:
        capitals = [token for token in utils.tokenize(value) if token.isupper()]
        return utils.compare(len(capitals), self.args["capital_relation"], int(self.args["capital_frequency"]))


class CapitalLettersEnglishChecker(Instruction):
    def describe(self) -> str:
        return "Your entire response should be in English, and in all capital letters."

    def check_following(self, value: str) -> bool:
        language = utils.detect_language(value)
        return value.isupper() and language in (None, "en")


class LowercaseLettersEnglishChecker(Instruction):
    def describe(self) -> str:
        return "Your entire response should be in English, and in all lowercase letters. No capital letters are allowed."

    def check_following(self, value: str) -> bool:
        language = utils.detect_language(value)
        return value.islower() and language in (None, "en")


class CommaChecker(Instruction):
    def describe(self) -> str:
        return "In your entire response, refrain from the use of any commas."

    def check_following(self, value: str) -> bool:
        return "," not in value
