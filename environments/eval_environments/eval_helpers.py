"""Shared pieces of the evaluation environments (``environments/eval_environments``).

The names are the ones Atropos's evaluation environments (and its test
``test_reasoning_models.py``) import from ``eval_helpers``:

* reasoning prompts: `HERMES_REASONING_PROMPT`, `HERMES_REASONING_PROMPT_WITH_ANSWER`,
  `get_default_thinking_prompt`, `get_thinking_prompt_or_hermes`, `create_system_content`;
* ``<think>`` handling: `validate_thinking_format`, `extract_thinking_content` and the
  ``THINK_*`` patterns; reasoning returned by the API (`extract_reasoning_from_response`,
  `extract_reasoning_from_completion`, `get_reasoning_token_usage`, `format_reasoning_debug_info`);
* ``<answer>`` extraction: `extract_letter_from_answer_tag`, `extract_number_from_answer_tag`,
  `extract_freeform_from_answer_tag`, `build_mcqa_fallback_patterns`,
  `extract_mcqa_answer_with_fallback`;
* math answers: `extract_boxed_answers`, `extract_first_boxed_answer`, `math_normalize_string`,
  `compare_math_strings`, `score_math_answer`, `score_math_answer_async`, `get_math_executor`,
  `format_math_answer_instruction`;
* result files and summaries: `save_eval_results`, `load_eval_results`, `calculate_accuracy`,
  `group_results_by_key`, `format_percentage`, `print_eval_summary`.

Nothing here injects a prompt by itself: in thinking mode the environments send
``custom_thinking_prompt`` when one is configured, and the server manager asks the API for
reasoning (``thinking_mode`` / ``reasoning_effort``).
"""

from __future__ import annotations

import asyncio
import json
import multiprocessing
import os
import re
from concurrent.futures import ProcessPoolExecutor
from string import ascii_uppercase
from typing import Any, Callable, Dict, List, Optional, Set, Tuple

from atroposlib.utils.reasoning_text import (
    THINK_CLOSE,
    THINK_OPEN,
    text_after_single_think_block,
    text_after_thinking,
    thinking_content,
)

try:
    from math_verify.errors import TimeoutException

    from atroposlib.utils.math_answers import answer_matches_gold, as_boxed, parse_answer, parse_gold

    MATH_VERIFY_AVAILABLE = True
except ImportError:  # math-verify is a core dependency; the string comparison is the fallback
    MATH_VERIFY_AVAILABLE = False
    TimeoutException = Exception  # type: ignore[assignment,misc]

# -- reasoning prompts ----------------------------------------------------------------------

HERMES_REASONING_PROMPT = (
    "You are a careful reasoner. Before you reply, think the problem through for as long as it "
    "needs: explore approaches, check each step and correct yourself where needed. Write all of "
    "that thinking inside a single <think> </think> block, and after the closing tag give your "
    "reply or solution."
)
"""A system prompt asking a Hermes-style model to reason inside ``<think></think>`` first."""

HERMES_REASONING_PROMPT_WITH_ANSWER = (
    HERMES_REASONING_PROMPT
    + " Once you have finished thinking, state your final answer inside <answer></answer> tags."
)
"""`HERMES_REASONING_PROMPT`, also asking for the final answer in ``<answer></answer>`` tags."""

# -- patterns -------------------------------------------------------------------------------

ANSWER_TAG_PATTERN = re.compile(r"<answer>(.*?)</answer>", re.DOTALL | re.IGNORECASE)
# The THINK_* names are Atropos's; the helpers below read think blocks through
# atroposlib.utils.reasoning_text, and these stay for code that imports them.
THINK_OPEN_PATTERN = THINK_OPEN
THINK_CLOSE_PATTERN = THINK_CLOSE
THINK_CONTENT_AFTER_PATTERN = re.compile(r"</think>\s*(.*)", re.DOTALL | re.IGNORECASE)
THINK_CONTENT_INSIDE_PATTERN = re.compile(r"<think>(.*?)</think>", re.DOTALL | re.IGNORECASE)

# Lead-ins a model may write before the answer itself, tried at the start of an <answer> tag.
ANSWER_PREFIXES = [
    r"(?:the\s+)?final\s+answer\s+is\s*:?\s*",
    r"(?:my\s+)?final\s+answer\s*:?\s*",
    r"(?:the\s+)?(?:correct\s+)?answer\s+is\s*:?\s*",
    r"(?:my\s+)?answer\s*:?\s*",
    r"(?:the\s+)?(?:correct\s+)?(?:choice|option)\s+is\s*:?\s*",
    r"(?:i\s+)?(?:choose|select|pick)\s*:?\s*",
    r"(?:i\s+)?(?:think|believe|would\s+say)\s+(?:it\s+is|it's|the\s+answer\s+is)\s*:?\s*",
    r"(?:it\s+is|it's|that\s+would\s+be|that's)\s*:?\s*",
]
ANSWER_PREFIX_PATTERN = re.compile(r"^(?:" + "|".join(ANSWER_PREFIXES) + r")", re.IGNORECASE)

# \boxed{...} with up to one level of nested braces (extract_boxed_answers handles any depth).
BOXED_PATTERN = re.compile(r"\\boxed\{([^{}]*(?:\{[^{}]*\}[^{}]*)*)\}")

_PUNCTUATION = ".,)(:;!? \t\n"
_LAST_MATCH_METHODS = {"final_answer_is", "the_answer_is", "answer_colon", "answer_space"}


def _answer_tag_content(response: str) -> Tuple[Optional[str], str]:
    """The stripped text of the first ``<answer>`` tag, or (None, why not)."""
    found = ANSWER_TAG_PATTERN.search(response or "")
    if not found:
        return None, "no_answer_tag"
    content = found.group(1).strip()
    return (content, "answer_tag") if content else (None, "empty_answer_tag")


def _strip_answer_prefix(content: str) -> str:
    lead = ANSWER_PREFIX_PATTERN.match(content)
    return content[lead.end():].strip() if lead else content


def _squash(text: str) -> str:
    return " ".join(text.lower().split())


def _letter_for_choice_text(content: str, choices: List[str], valid_letters: Set[str]) -> Optional[str]:
    """The letter whose choice text the answer gives (exactly, after a letter label, or inside
    a longer answer when the choice is at least three characters long)."""
    answer = _squash(content)
    for index, text in enumerate(choices[: len(ascii_uppercase)]):
        letter = ascii_uppercase[index]
        choice = _squash(str(text))
        if letter not in valid_letters or not choice:
            continue
        if answer == choice or (len(choice) >= 3 and choice in answer):
            return letter
        labelled = re.match(rf"^(?:\(\s*{letter}\s*\)|{letter}\s*[)\-.:\]])\s*(.*)$", content.strip(), re.IGNORECASE | re.DOTALL)
        if labelled and _squash(labelled.group(1)) == choice:
            return letter
    return None


def extract_letter_from_answer_tag(
    response: str, valid_letters: Set[str], debug: bool = False, choices: Optional[List[str]] = None
) -> Tuple[Optional[str], str]:
    """The single choice letter given in the first ``<answer>`` tag, and how it was found.

    Accepted: a bare letter (``B``, ``(B)``, ``B.``), one after a lead-in ("The answer is B"),
    the text of a choice when `choices` is given, or exactly one valid letter standing alone
    among other words. Two or more candidate letters are ambiguous and give None.
    Methods: ``answer_tag``, ``answer_tag_choice_match``, ``no_answer_tag``,
    ``empty_answer_tag``, ``answer_tag_ambiguous``, ``answer_tag_no_letter``.
    """
    content, method = _answer_tag_content(response)
    if content is None:
        return None, method
    valid = {letter.upper() for letter in valid_letters}
    stripped = _strip_answer_prefix(content)
    bare = stripped.strip(_PUNCTUATION).upper()
    if bare in valid:
        return bare, "answer_tag"
    if choices:
        letter = _letter_for_choice_text(content, choices, valid)
        if letter:
            if debug:
                print(f"    answer tag names choice {letter}")
            return letter, "answer_tag_choice_match"
    standalone = re.compile(r"\b(" + "|".join(sorted(valid)) + r")\b")
    for text in (stripped, content):
        found = standalone.findall(text.upper())
        if len(found) == 1:
            return found[0], "answer_tag"
    if standalone.findall(stripped.upper()):
        if debug:
            print(f"    several letters in the answer tag: {content!r}")
        return None, "answer_tag_ambiguous"
    return None, "answer_tag_no_letter"


def extract_number_from_answer_tag(response: str, num_choices: int, debug: bool = False) -> Tuple[Optional[int], str]:
    """The single choice number (1..`num_choices`) given in the first ``<answer>`` tag.
    Methods: ``answer_tag``, ``no_answer_tag``, ``empty_answer_tag``, ``answer_tag_ambiguous``,
    ``answer_tag_no_number``."""
    content, method = _answer_tag_content(response)
    if content is None:
        return None, method
    stripped = _strip_answer_prefix(content)
    bare = stripped.strip(_PUNCTUATION)
    if bare.isdigit() and 1 <= int(bare) <= num_choices:
        return int(bare), "answer_tag"

    def in_range(text: str) -> List[int]:
        return [int(n) for n in re.findall(r"\b(\d+)\b", text) if 1 <= int(n) <= num_choices]

    for text in (stripped, content):
        numbers = in_range(text)
        if len(numbers) == 1:
            return numbers[0], "answer_tag"
    if in_range(stripped):
        if debug:
            print(f"    several numbers in the answer tag: {content!r}")
        return None, "answer_tag_ambiguous"
    return None, "answer_tag_no_number"


def extract_freeform_from_answer_tag(response: str, debug: bool = False) -> Tuple[Optional[str], str]:
    """The stripped text of the first ``<answer>`` tag (open questions: SimpleQA, DROP)."""
    content, method = _answer_tag_content(response)
    if debug and content is not None:
        print(f"    answer tag: {content[:60]!r}")
    return content, method


# -- thinking -------------------------------------------------------------------------------


def validate_thinking_format(response: str, thinking_mode: bool = True) -> Tuple[bool, str]:
    """(valid, text to read the answer from). Outside thinking mode every response is valid.
    In thinking mode the response needs exactly one ``<think>`` and one ``</think>``, in that
    order (`text_after_single_think_block`), and the answer is read from the stripped text
    after ``</think>``; an invalid response is returned whole."""
    if not thinking_mode:
        return True, response
    after = text_after_single_think_block(response)
    return (False, response) if after is None else (True, after.strip())


def extract_thinking_content(response: str) -> Optional[str]:
    """The stripped text inside the first ``<think></think>`` block, or None."""
    thought = thinking_content(response)
    return None if thought is None else thought.strip()


def get_default_thinking_prompt(custom_prompt: Optional[str] = None) -> Optional[str]:
    """The thinking system prompt: `custom_prompt`, or None (no prompt is injected by default;
    pass `HERMES_REASONING_PROMPT` to use it)."""
    return custom_prompt or None


def get_thinking_prompt_or_hermes(custom_prompt: Optional[str] = None) -> str:
    """`custom_prompt`, or `HERMES_REASONING_PROMPT` when none is given."""
    return custom_prompt or HERMES_REASONING_PROMPT


def create_system_content(
    thinking_mode: bool, custom_thinking_prompt: Optional[str] = None, custom_system_prompt: Optional[str] = None
) -> Optional[str]:
    """The system message of an evaluation request: in thinking mode the thinking prompt (if
    any) followed by `custom_system_prompt`; otherwise `custom_system_prompt`; None if empty."""
    parts = [get_default_thinking_prompt(custom_thinking_prompt)] if thinking_mode else []
    parts.append(custom_system_prompt)
    text = "\n\n".join(part for part in parts if part)
    return text or None


def _field(obj: Any, name: str) -> Any:
    if isinstance(obj, dict):
        return obj.get(name)
    value = getattr(obj, name, None)
    if value is None:  # pydantic models keep unknown response fields in model_extra
        extra = getattr(obj, "model_extra", None)
        if isinstance(extra, dict):
            value = extra.get(name)
    return value


def _details_text(details: Any) -> Optional[str]:
    for detail in details or []:
        text = _field(detail, "text")
        if text:
            return text
    return None


def extract_reasoning_from_response(response: Any, content: Optional[str] = None) -> Tuple[Optional[str], str]:
    """Reasoning text of a chat choice (or message), and where it was found: a
    ``reasoning_content`` field, a ``reasoning`` field, ``reasoning_details[].text`` (on the
    choice or its message), or a ``<think>`` block in `content`. Sources:
    ``reasoning_content``, ``reasoning``, ``reasoning_details``, ``think_block``, ``none``."""
    message = _field(response, "message")
    for holder in (response, message):
        if holder is None:
            continue
        for name in ("reasoning_content", "reasoning"):
            value = _field(holder, name)
            if isinstance(value, str) and value:
                return value, name
    for holder in (response, message):
        text = _details_text(_field(holder, "reasoning_details")) if holder is not None else None
        if text:
            return text, "reasoning_details"
    if content:
        thought = extract_thinking_content(content)
        if thought is not None:
            return thought, "think_block"
    return None, "none"


def extract_reasoning_from_completion(completion: Any, choice_idx: int = 0) -> Tuple[Optional[str], str, Optional[str]]:
    """(reasoning, source, message content) of choice `choice_idx` of a chat completion."""
    choices = _field(completion, "choices") if completion else None
    if not choices or choice_idx >= len(choices):
        return None, "none", None
    choice = choices[choice_idx]
    message = _field(choice, "message")
    content = _field(message, "content") if message is not None else None
    reasoning, source = extract_reasoning_from_response(choice, content)
    return reasoning, source, content


def get_reasoning_token_usage(completion: Any) -> Dict[str, Any]:
    """Token counts of a completion: model, prompt/completion/total tokens, reasoning and
    cached tokens, cost and provider (where the API reports them), and whether the message
    carries separate reasoning."""
    usage_info: Dict[str, Any] = dict.fromkeys(
        ("model", "completion_tokens", "prompt_tokens", "total_tokens", "reasoning_tokens", "cached_tokens",
         "cost", "provider"))
    usage_info["has_reasoning_content"] = False
    if not completion:
        return usage_info
    usage_info["model"] = _field(completion, "model")
    usage_info["provider"] = _field(completion, "provider")
    choices = _field(completion, "choices") or []
    message = _field(choices[0], "message") if choices else None
    if message is not None and (_field(message, "reasoning") or _field(message, "reasoning_details")
                                or _field(message, "reasoning_content")):
        usage_info["has_reasoning_content"] = True
    usage = _field(completion, "usage")
    if not usage:
        return usage_info
    for name in ("completion_tokens", "prompt_tokens", "total_tokens", "cost"):
        usage_info[name] = _field(usage, name)
    completion_details = _field(usage, "completion_tokens_details")
    if completion_details:
        usage_info["reasoning_tokens"] = _field(completion_details, "reasoning_tokens")
    prompt_details = _field(usage, "prompt_tokens_details")
    if prompt_details:
        usage_info["cached_tokens"] = _field(prompt_details, "cached_tokens")
    return usage_info


def format_reasoning_debug_info(completion: Any, reasoning_content: Optional[str] = None) -> str:
    """A few indented lines describing a completion's token use (for ``full_debug``)."""
    usage = get_reasoning_token_usage(completion)
    lines = ["  [reasoning / tokens]"]
    for key, label in (("model", "model"), ("provider", "provider")):
        if usage[key]:
            lines.append(f"    {label}: {usage[key]}")
    if usage["prompt_tokens"] is not None:
        cached = f" (cached {usage['cached_tokens']})" if usage["cached_tokens"] else ""
        lines.append(f"    prompt tokens: {usage['prompt_tokens']}{cached}")
    if usage["completion_tokens"] is not None:
        lines.append(f"    completion tokens: {usage['completion_tokens']}")
    if usage["reasoning_tokens"] is not None:
        lines.append(f"    reasoning tokens: {usage['reasoning_tokens']}")
        if usage["completion_tokens"]:
            lines.append(f"    reasoning share: {100 * usage['reasoning_tokens'] / usage['completion_tokens']:.1f}%")
    if usage["has_reasoning_content"]:
        lines.append("    separate reasoning content: yes")
    if usage["cost"] is not None:
        lines.append(f"    cost: ${usage['cost']:.6f}")
    if usage["total_tokens"] is not None:
        lines.append(f"    total tokens: {usage['total_tokens']}")
    if reasoning_content:
        lines.append(f"    reasoning length: {len(reasoning_content)} chars")
    return "\n".join(lines)


# -- multiple choice fallbacks ----------------------------------------------------------------


def build_mcqa_fallback_patterns(num_choices: int = 4) -> List[Tuple[int, "re.Pattern[str]", str]]:
    """(priority, pattern, method) for finding a choice letter without ``<answer>`` tags, most
    specific first: "final answer is X. I hope", "final answer ... is X", "the answer is X",
    "answer: X", "answer X", a letter opening the response, a letter opening a line, a
    standalone letter. Letters may be written ``X`` or ``(X)``."""
    letters = ascii_uppercase[:num_choices]
    letter = rf"([{letters}]|\([{letters}]\))"
    flags = re.IGNORECASE
    return [
        (0, re.compile(rf"final\s+answer\s+is\s*:?\s*{letter}\.?\s*I\s*hope", flags), "final_answer_hope"),
        (50, re.compile(rf"final\s+answer.{{0,100}}?\s+is\s*:?\s*{letter}", flags | re.DOTALL), "final_answer_is"),
        (75, re.compile(rf"the\s+answer\s+is\s*:?\s*{letter}", flags), "the_answer_is"),
        (100, re.compile(rf"answer\s*:\s*.{{0,50}}?{letter}", flags | re.DOTALL), "answer_colon"),
        (150, re.compile(rf"answer\s+{letter}", flags), "answer_space"),
        (200, re.compile(rf"^\s*\**{letter}\**[\s.):]", flags), "start"),
        (210, re.compile(rf"\n\s*\**{letter}\**[\s.):]", flags), "line_start"),
        (250, re.compile(rf"\b{letter}\b", flags), "standalone"),
    ]


def _last_valid_letter(response: str, valid_letters: Set[str]) -> Optional[str]:
    upper = response.upper()
    positions = {letter: upper.rfind(letter) for letter in valid_letters}
    letter, position = max(positions.items(), key=lambda item: item[1], default=(None, -1))
    return letter if position >= 0 else None


def extract_mcqa_answer_with_fallback(
    response: str, num_choices: int = 4, fallback_patterns: Optional[list] = None, debug: bool = False,
    choices: Optional[List[str]] = None, last_resort: bool = True,
) -> Tuple[Optional[str], str]:
    """A choice letter: from the ``<answer>`` tag first, then the fallback patterns in priority
    order (the last match for "answer is/answer:" patterns, the first otherwise), then (when
    `last_resort`) the valid letter appearing last in the response. Methods as in
    `extract_letter_from_answer_tag`, ``fallback_<pattern>``, ``fallback_last_valid_letter``,
    ``empty_response`` or ``no_match``."""
    if not response:
        return None, "empty_response"
    valid = set(ascii_uppercase[:num_choices])
    letter, method = extract_letter_from_answer_tag(response, valid, debug, choices=choices)
    if letter:
        return letter, method
    for priority, pattern, name in fallback_patterns or build_mcqa_fallback_patterns(num_choices):
        matches = pattern.findall(response)
        if not matches:
            continue
        match = matches[-1] if name in _LAST_MATCH_METHODS else matches[0]
        letter = (match[0] if isinstance(match, tuple) else match).strip("()").upper()
        if letter in valid:
            if debug:
                print(f"    letter {letter} from fallback {name} (priority {priority})")
            return letter, f"fallback_{name}"
    if last_resort:
        letter = _last_valid_letter(response, valid)
        if letter:
            return letter, "fallback_last_valid_letter"
    return None, "no_match"


# -- math answers -------------------------------------------------------------------------------

_math_executor: Optional[ProcessPoolExecutor] = None


def get_math_executor(max_workers: int = 64) -> ProcessPoolExecutor:
    """The shared process pool for math verification (sympy parsing can hang; a worker
    process keeps that out of the event loop and lets math-verify's alarms work). At most
    one worker per CPU is started, whatever `max_workers` asks for."""
    global _math_executor
    if _math_executor is None:
        workers = max(1, min(max_workers, os.cpu_count() or 1))
        context = multiprocessing.get_context("fork") if os.name == "posix" else None
        _math_executor = ProcessPoolExecutor(max_workers=workers, mp_context=context)
    return _math_executor


def shutdown_math_executor() -> None:
    """Stop the shared math verification pool (it is created again when next needed)."""
    global _math_executor
    if _math_executor is not None:
        _math_executor.shutdown(wait=True, cancel_futures=True)
        _math_executor = None


def extract_boxed_answers(text: str) -> List[str]:
    """The contents of every ``\\boxed{...}`` in `text`, braces balanced at any depth."""
    answers, start = [], 0
    while True:
        found = (text or "").find("\\boxed", start)
        if found < 0:
            return answers
        position = found + len("\\boxed")
        while position < len(text) and text[position] == " ":
            position += 1
        if position >= len(text) or text[position] != "{":
            start = position
            continue
        depth, end = 0, position
        while end < len(text):
            depth += {"{": 1, "}": -1}.get(text[end], 0)
            if depth == 0:
                break
            end += 1
        if depth:
            return answers  # unbalanced: the rest is not a complete answer
        answers.append(text[position + 1:end])
        start = end + 1


def _after_think(response: str, after_think: bool) -> str:
    """The part of `response` a boxed answer is read from: after the last ``</think>`` when
    `after_think` (`text_after_thinking`), else all of it."""
    return text_after_thinking(response) if after_think else response


def extract_first_boxed_answer(response: str, after_think: bool = True, debug: bool = False) -> Tuple[Optional[str], str, bool]:
    """(answer, method, several boxed): the only ``\\boxed{}`` answer (after ``</think>`` when
    `after_think`). More than one boxed answer is a failure (``multiple_boxed``)."""
    boxed = extract_boxed_answers(_after_think(response, after_think))
    if not boxed:
        return None, "no_boxed", False
    if len(boxed) > 1:
        if debug:
            print(f"    {len(boxed)} boxed answers: rejected")
        return None, "multiple_boxed", True
    return boxed[0].strip(), "boxed", False


def _unwrap(text: str, command: str) -> str:
    """`text` with every ``\\command{X}`` replaced by X."""
    return re.sub(r"\\" + command + r"\{([^{}]*)\}", r"\1", text)


def math_normalize_string(text: str) -> str:
    """A math answer reduced for string comparison: no ``\\boxed``/``\\text``-style wrappers,
    spacing commands, ``$`` signs or trailing punctuation; operators spelled plainly;
    whitespace collapsed; lower case."""
    if not text:
        return ""
    text = text.strip()
    boxed = extract_boxed_answers(text)
    if boxed:
        text = boxed[0]
    text = " ".join(text.split())
    text = re.sub(r"\\[,;:!]", "", text)
    text = re.sub(r"\\q?quad", " ", text)
    for command in ("text", "textbf", "mathrm", "mathbf"):
        text = _unwrap(text, command)
    for latex, plain in (("\\times", "*"), ("\\cdot", "*"), ("\\div", "/"), ("\\pm", "+-"), ("$", "")):
        text = text.replace(latex, plain)
    return " ".join(text.rstrip(".,;:").lower().split())


def compare_math_strings(pred: str, gold: str) -> bool:
    """Whether two answers agree as normalized strings or as numbers (thousands separators
    ignored, relative tolerance 1e-6)."""
    left, right = math_normalize_string(pred), math_normalize_string(gold)
    if not left:
        return False
    if left == right:
        return True
    try:
        a, b = float(left.replace(",", "").replace(" ", "")), float(right.replace(",", "").replace(" ", ""))
    except ValueError:
        return False
    return a == b or (b != 0 and abs(a - b) / abs(b) < 1e-6)


def _score_math_answer_worker(gold: str, response: str, wrap_gold_boxed: bool = True) -> Tuple[Optional[bool], str]:
    """(correct or None, method) for `response` (already cut after ``</think>``) against
    `gold`: math-verify's symbolic comparison, else the string comparison of the first boxed
    answer. Runs in a worker process of `get_math_executor`."""
    boxed = extract_boxed_answers(response)

    def by_string(method: str) -> Tuple[Optional[bool], str]:
        return (compare_math_strings(boxed[0], gold), method) if boxed else (None, method.replace("string_fallback_", ""))

    if not MATH_VERIFY_AVAILABLE:
        return by_string("string_fallback_no_lib")
    try:
        gold_parsed = parse_gold(as_boxed(gold) if wrap_gold_boxed else gold)
        if not gold_parsed:
            return by_string("string_fallback_gold_parse")
        answer_parsed = parse_answer(response, shorten_equation_chains=True)
        if not answer_parsed:
            return by_string("string_fallback_response_parse")
        if answer_matches_gold(gold_parsed, answer_parsed):
            return True, "math_verify"
        # math-verify can miss plain-number agreement (e.g. "1,000" vs "1000")
        return (True, "string_fallback_match") if boxed and compare_math_strings(boxed[0], gold) else (False, "math_verify")
    except TimeoutException:
        return by_string("string_fallback_timeout")
    except Exception:  # noqa: BLE001 - any parser failure falls back to strings
        return by_string("string_fallback_error")


def _boxed_precheck(response: str, after_think: bool, debug: bool) -> Tuple[str, Optional[Tuple[None, str, bool]]]:
    content = _after_think(response, after_think)
    boxed = extract_boxed_answers(content)
    if len(boxed) > 1:
        if debug:
            print(f"    {len(boxed)} boxed answers: rejected")
        return content, (None, "multiple_boxed", True)
    if not boxed:
        return content, (None, "no_boxed", False)
    return content, None


def score_math_answer(
    gold: str, response: str, after_think: bool = True, wrap_gold_boxed: bool = True,
    executor: Optional[ProcessPoolExecutor] = None, debug: bool = False,
) -> Tuple[Optional[bool], str, bool]:
    """(correct or None, method, several boxed) for a full `response`: exactly one
    ``\\boxed{}`` answer (after ``</think>`` when `after_think`) is compared with `gold`.
    With an `executor` the comparison runs in it (30 s limit)."""
    content, early = _boxed_precheck(response, after_think, debug)
    if early:
        return early
    if executor is None:
        correct, method = _score_math_answer_worker(gold, content, wrap_gold_boxed)
    else:
        try:
            correct, method = executor.submit(_score_math_answer_worker, gold, content, wrap_gold_boxed).result(timeout=30)
        except Exception as exc:  # noqa: BLE001
            if debug:
                print(f"    math verification failed: {exc}")
            correct, method = compare_math_strings(extract_boxed_answers(content)[0], gold), "string_fallback_executor_error"
    return correct, method, False


async def score_math_answer_async(
    gold: str, response: str, after_think: bool = True, wrap_gold_boxed: bool = True,
    executor: Optional[ProcessPoolExecutor] = None, debug: bool = False,
) -> Tuple[Optional[bool], str, bool]:
    """`score_math_answer` for event loops: the comparison runs in `executor` (the shared
    `get_math_executor()` pool when None) without blocking the loop."""
    content, early = _boxed_precheck(response, after_think, debug)
    if early:
        return early
    pool = executor or get_math_executor()
    try:
        correct, method = await asyncio.wait_for(
            asyncio.get_running_loop().run_in_executor(pool, _score_math_answer_worker, gold, content, wrap_gold_boxed),
            timeout=30,
        )
    except Exception as exc:  # noqa: BLE001
        if debug:
            print(f"    math verification failed: {exc}")
        correct, method = compare_math_strings(extract_boxed_answers(content)[0], gold), "string_fallback_executor_error"
    if debug:
        print(f"    correct={correct} ({method})")
    return correct, method, False


def format_math_answer_instruction(include_hope: bool = True) -> str:
    """How a math answer must end: with `include_hope`, a last line
    ``Therefore, the final answer is: $\\boxed{ANSWER}$. I hope it is correct`` (the layout
    lighteval's math tasks parse); otherwise just a ``\\boxed{}`` answer."""
    if include_hope:
        return ("Finish with a last line written exactly as 'Therefore, the final answer is: "
                "$\\boxed{ANSWER}$. I hope it is correct' (no quotes), where ANSWER is only the final "
                "number or expression.")
    return "Give the final answer inside \\boxed{}, for instance \\boxed{7} or \\boxed{\\frac{2}{3}}."


# -- results --------------------------------------------------------------------------------


def save_eval_results(
    save_dir: str, metrics: Dict, results: List[Dict], metrics_filename: str = "metrics.json",
    results_filename: str = "results.jsonl", print_confirmation: bool = True,
) -> Tuple[str, str]:
    """Write `metrics` (JSON) and `results` (JSON Lines) into `save_dir`; their paths."""
    os.makedirs(save_dir, exist_ok=True)
    metrics_path, results_path = os.path.join(save_dir, metrics_filename), os.path.join(save_dir, results_filename)
    with open(metrics_path, "w", encoding="utf-8") as handle:
        json.dump(metrics, handle, indent=2, default=str)
    with open(results_path, "w", encoding="utf-8") as handle:
        for row in results:
            handle.write(json.dumps(row, default=str) + "\n")
    if print_confirmation:
        print(f"results saved to {save_dir}")
    return metrics_path, results_path


def load_eval_results(
    save_dir: str, metrics_filename: str = "metrics.json", results_filename: str = "results.jsonl"
) -> Tuple[Dict, List[Dict]]:
    """What `save_eval_results` wrote: (metrics, results)."""
    with open(os.path.join(save_dir, metrics_filename), encoding="utf-8") as handle:
        metrics = json.load(handle)
    with open(os.path.join(save_dir, results_filename), encoding="utf-8") as handle:
        results = [json.loads(line) for line in handle if line.strip()]
    return metrics, results


def calculate_accuracy(
    results: List[Dict], score_key: str = "is_correct", filter_fn: Optional[Callable[[Dict], bool]] = None
) -> float:
    """Share of `results` (optionally those passing `filter_fn`) whose `score_key` is truthy."""
    kept = [row for row in results if filter_fn is None or filter_fn(row)]
    return sum(1 for row in kept if row.get(score_key)) / len(kept) if kept else 0.0


def group_results_by_key(results: List[Dict], key: str) -> Dict[str, List[Dict]]:
    """`results` grouped by the value of `key` (``unknown`` when missing), in first-seen order."""
    grouped: Dict[str, List[Dict]] = {}
    for row in results:
        grouped.setdefault(row.get(key, "unknown"), []).append(row)
    return grouped


def format_percentage(value: float, decimals: int = 2) -> str:
    """0.755 -> ``75.50%``."""
    return f"{value * 100:.{decimals}f}%"


def print_eval_summary(title: str, metrics: Dict[str, float], width: int = 60) -> None:
    """Print `metrics` under `title`, rates in [0, 1] as percentages."""
    rule = "=" * width
    print(f"\n{rule}\n{title}\n{rule}")
    for name, value in metrics.items():
        shown = format_percentage(value) if isinstance(value, float) and 0 <= value <= 1 else value
        print(f"  {name}: {shown}")
    print(f"{rule}\n")
