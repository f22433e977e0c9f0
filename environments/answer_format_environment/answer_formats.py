"""The answer-format catalogue: ways to present a final answer, each with its instruction and its check.

A format is an instruction given to the model (with an example) and a check of the *response
section*: the text after the single ``</think>``. The check returns the answer it finds, or None
when the section does not use the format exactly once. Formats belong to a domain: ``generic``
ones suit any question, ``math_only`` ones (LaTeX mathematics, derivation layouts) are offered
for math datasets and ``code_only`` ones for code datasets, in addition to the generic ones.

`extract_answer` applies the thinking rules shared by every format: exactly one ``<think>`` and
one ``</think>``, in that order, and the format after them.
"""

from __future__ import annotations

import configparser
import csv
import io
import json
import re
import tomllib
import xml.etree.ElementTree as ElementTree
from dataclasses import dataclass
from enum import Enum
from typing import Any, Callable, Optional

import yaml

from atroposlib.utils.reasoning_text import text_after_single_think_block

Check = Callable[[str], Optional[str]]
DOTALL_I = re.DOTALL | re.IGNORECASE


@dataclass(frozen=True)
class FormatSpec:
    """One answer format: its name, domain, instruction, example and check."""

    value: str
    instruction: str
    example: str
    check: Check
    domain: str = "generic"
    complex: bool = False


def _nonempty(text: Optional[str]) -> Optional[str]:
    if text is None:
        return None
    text = text.strip()
    return text or None


def _only(matches: list[str]) -> Optional[str]:
    """The single match's content, or None when there are none or several."""
    return _nonempty(matches[0]) if len(matches) == 1 else None


# -- tags ----------------------------------------------------------------------------------------
def _tag_check(tag: str) -> Check:
    def check(section: str) -> Optional[str]:
        opens = re.findall(rf"<{tag}>", section, re.IGNORECASE)
        closes = re.findall(rf"</{tag}>", section, re.IGNORECASE)
        if len(opens) != 1 or len(closes) != 1:
            return None
        return _only(re.findall(rf"<{tag}>(.*?)</{tag}>", section, DOTALL_I))
    return check


def tag_format(value: str, tag: str) -> FormatSpec:
    return FormatSpec(value, f"Put your final answer inside <{tag}></{tag}> tags, one pair only.",
                      f"<{tag}>your answer</{tag}>", _tag_check(tag))


def nested_format(outer: str, inner: str) -> FormatSpec:
    def check(section: str) -> Optional[str]:
        outer_text = _tag_check(outer)(section)
        if outer_text is None or len(re.findall(rf"<{inner}>", section, re.IGNORECASE)) != 1:
            return None
        return _tag_check(inner)(outer_text)
    return FormatSpec(f"nested_{outer}_{inner}",
                      f"Write one <{outer}> block: a short explanation, then the final answer in <{inner}></{inner}> "
                      f"tags inside it. Use each tag pair once.",
                      f"<{outer}>why it holds\n<{inner}>your answer</{inner}></{outer}>", check)


TAGS = {"xml": "answer", **{f"{t}_tags": t for t in (
    "output", "result", "response", "final_answer", "solution", "conclusion", "reply", "verdict", "summary",
    "final", "decision", "choice", "outcome", "resolution")}}
HTML_TAGS = ("code", "pre", "span", "div", "p", "strong", "em", "b", "mark", "blockquote")
NESTED = (("response", "answer"), ("solution", "answer"), ("output", "result"), ("analysis", "conclusion"),
          ("reasoning", "answer"), ("report", "finding"))


# -- lines that start with a phrase or a symbol ---------------------------------------------------
def label_format(value: str, label: str) -> FormatSpec:
    flags = 0 if label.isupper() else re.IGNORECASE

    def check(section: str) -> Optional[str]:
        if len(re.findall(re.escape(label), section, flags)) != 1:
            return None
        return _only(re.findall(rf"^[ \t]*{re.escape(label)}[ \t]*(.+)$", section, flags | re.MULTILINE))
    return FormatSpec(value, f'Write one line that begins with "{label}" followed by your answer; do not use '
                             f'that phrase anywhere else.', f"{label} your answer", check)


LABELS = {
    "natural_language_answer": "The answer is:", "natural_language_final": "Final answer:",
    "natural_language_conclusion": "In conclusion:", "natural_language_therefore": "Therefore:",
    "natural_language_result": "The result is:", "natural_language_best": "The best answer is:",
    "natural_language_my_final": "My final answer is:", "natural_language_correct": "The correct answer is:",
    "natural_language_solution": "The solution is:", "natural_language_response": "My response is:",
    "natural_language_ultimately": "Ultimately:", "natural_language_thus": "Thus:",
    "natural_language_hence": "Hence:", "natural_language_consequently": "Consequently:",
    "natural_language_to_summarize": "To summarize:", "natural_language_in_summary": "In summary:",
    "natural_language_overall": "Overall:", "natural_language_final_verdict": "Final verdict:",
    "natural_language_bottom_line": "Bottom line:", "natural_language_key_point": "The key point is:",
    "natural_language_short_answer": "Short answer:", "natural_language_all_told": "All told:",
    "colon_format": "Answer:", "answer_is_format": "ANSWER IS:", "solution_is_format": "SOLUTION IS:",
    "result_is_format": "RESULT IS:", "output_is_format": "OUTPUT IS:", "verdict_is_format": "VERDICT IS:",
}


def symbol_format(value: str, symbol: str, domain: str = "generic") -> FormatSpec:
    def check(section: str) -> Optional[str]:
        lines = [line.strip() for line in section.splitlines() if line.strip()]
        found = [line[len(symbol):] for line in lines if line.split(maxsplit=1)[0] == symbol]
        return _only(found)
    return FormatSpec(value, f'Write your answer on one line that starts with "{symbol}" and a space; no other '
                             f'line may start with "{symbol}".', f"{symbol} your answer", check, domain)


SYMBOLS = {
    "equals_format": "=", "dash_format": "-", "plus_format": "+", "star_format": "*", "percent_format": "%",
    "ampersand_format": "&", "at_format": "@", "exclamation_format": "!", "question_format": "?",
    "semicolon_format": ";", "double_colon_format": "::", "triple_dash_format": "---", "double_arrow_format": ">>",
    "triple_arrow_format": ">>>", "arrow_format": "=>", "thin_arrow_format": "->", "unicode_arrow_format": "\u2192",
    "tilde_arrow_format": "~>", "pipe_arrow_format": "|>", "caret_format": "^", "python_comment": "#",
    "javascript_comment": "//", "markdown_quote": ">", "markdown_header": "##",
}


# -- inline delimiters -----------------------------------------------------------------------------
def delimited_format(value: str, opening: str, closing: str, description: str) -> FormatSpec:
    o, c = re.escape(opening), re.escape(closing)
    first_o, last_c = re.escape(opening[0]), re.escape(closing[-1])
    excluded = re.escape("".join(sorted(set(opening + closing))))
    pattern = re.compile(rf"(?<!{first_o}){o}([^{excluded}\n]+){c}(?!{last_c})")

    def check(section: str) -> Optional[str]:
        return _only(pattern.findall(section))
    return FormatSpec(value, f"Enclose your answer in {description}, once, on a single line.",
                      f"{opening}your answer{closing}", check)


DELIMITERS = {
    "pipe_delimited": ("|", "|", "pipes"), "hash_delimited": ("#", "#", "hash signs"),
    "underscore_delimited": ("_", "_", "underscores"), "tilde_delimited": ("~", "~", "tildes"),
    "backtick_format": ("`", "`", "single backticks"), "double_backtick_format": ("``", "``", "double backticks"),
    "quote_format": ('"', '"', "double quotes"), "single_quote_format": ("'", "'", "single quotes"),
    "triple_quote_format": ('"""', '"""', "triple double quotes"),
    "square_brackets": ("[", "]", "square brackets"), "double_square_brackets": ("[[", "]]", "double square brackets"),
    "curly_braces": ("{", "}", "curly braces"), "double_curly_braces": ("{{", "}}", "double curly braces"),
    "parentheses": ("(", ")", "parentheses"), "angle_brackets": ("<<", ">>", "double angle brackets << >>"),
    "guillemets": ("\u00ab", "\u00bb", "guillemets \u00ab \u00bb"),
}


# -- LaTeX ---------------------------------------------------------------------------------------------
def _braced(text: str, start: int) -> Optional[str]:
    """The content of the brace group opening at ``text[start]`` (nested braces allowed)."""
    depth = 0
    for i in range(start, len(text)):
        if text[i] == "{":
            depth += 1
        elif text[i] == "}":
            depth -= 1
            if depth == 0:
                return text[start + 1:i]
    return None


def command_format(value: str, command: str, dollars: bool = False, domain: str = "generic") -> FormatSpec:
    opener = ("$" if dollars else "") + f"\\{command}{{"

    def check(section: str) -> Optional[str]:
        if section.count(f"\\{command}{{") != 1 or section.count(opener) != 1:
            return None
        start = section.index(opener) + len(opener) - 1
        content = _braced(section, start)
        if content is None:
            return None
        if dollars and not section[start + len(content) + 2:].startswith("$"):
            return None
        return _nonempty(content)
    wrapped = f"$\\{command}{{...}}$" if dollars else f"\\{command}{{...}}"
    return FormatSpec(value, f"Write your answer once as {wrapped}.",
                      wrapped.replace("...", "your answer"), check, domain)


def environment_format(value: str, env: str, dollars: bool = False) -> FormatSpec:
    begin, end = re.escape(f"\\begin{{{env}}}"), re.escape(f"\\end{{{env}}}")
    outer = (r"\$", r"\$") if dollars else ("", "")

    def check(section: str) -> Optional[str]:
        if section.count(f"\\begin{{{env}}}") != 1:
            return None
        return _only(re.findall(rf"{outer[0]}{begin}(.*?){end}{outer[1]}", section, re.DOTALL))
    shown = f"\\begin{{{env}}} ... \\end{{{env}}}"
    if dollars:
        shown = f"${shown}$"
    return FormatSpec(value, f"Write your answer once in a LaTeX {env} environment: {shown}.",
                      shown.replace("...", "your answer"), check, "math_only")


def math_pattern_format(value: str, pattern: str, marker: str, markers: int, shown: str,
                        instruction: str) -> FormatSpec:
    """`pattern` captures the answer; `marker` must occur exactly `markers` times (so once as a span)."""
    def check(section: str) -> Optional[str]:
        if len(re.findall(marker, section)) != markers:
            return None
        return _only(re.findall(pattern, section, re.DOTALL))
    return FormatSpec(value, instruction, shown, check, "math_only")


SINGLE_DOLLAR = r"(?<![\$\\])\$(?!\$)"
MATH_FORMATS = [
    command_format("latex_boxed_math", "boxed", dollars=True, domain="math_only"),
    command_format("latex_text_math", "text", dollars=True, domain="math_only"),
    command_format("latex_mathrm", "mathrm", dollars=True, domain="math_only"),
    command_format("latex_mathbf", "mathbf", dollars=True, domain="math_only"),
    environment_format("latex_align", "align"),
    environment_format("latex_equation", "equation"),
    environment_format("latex_gather", "gather"),
    environment_format("latex_matrix", "matrix", dollars=True),
    environment_format("latex_pmatrix", "pmatrix", dollars=True),
    environment_format("latex_bmatrix", "bmatrix", dollars=True),
    math_pattern_format("latex_displaymath", r"\\\[(.*?)\\\]", r"\\\[", 1, r"\[ your answer \]",
                        r"Write your answer once as display math between \[ and \]."),
    math_pattern_format("latex_display_dollars", r"\$\$(.+?)\$\$", r"\$\$", 2, "$$ your answer $$",
                        "Write your answer once as display math between $$ and $$; use no other $$."),
    math_pattern_format("latex_inline_math", rf"{SINGLE_DOLLAR}([^$\n]+?){SINGLE_DOLLAR}", SINGLE_DOLLAR, 2,
                        "$your answer$", "Write your answer once as inline math between two single $ signs."),
    math_pattern_format("latex_therefore", r"\$\\therefore\s*([^$]+)\$", r"\\therefore", 1, r"$\therefore your answer$",
                        r"Write your answer once as inline math that starts with \therefore: $\therefore ...$."),
    math_pattern_format("latex_implies", r"\$\\implies\s*([^$]+)\$", r"\\implies", 1, r"$\implies your answer$",
                        r"Write your answer once as inline math that starts with \implies: $\implies ...$."),
    math_pattern_format("latex_equiv", r"\$[^$]*?\\equiv\s*([^$]+)\$", r"\\equiv", 1, r"$x \equiv your answer$",
                        r"Write your answer once as an equivalence in inline math, $expression \equiv answer$."),
]
TEXT_COMMANDS = {"latex_boxed": "boxed", "latex_textbf": "textbf", "latex_textit": "textit",
                 "latex_underline": "underline", "latex_emph": "emph", "latex_fbox": "fbox", "latex_texttt": "texttt"}


# -- Markdown ------------------------------------------------------------------------------------------
def _markdown_code(section: str) -> Optional[str]:
    if section.count("```") != 2:
        return None
    return _only(re.findall(r"```[\w+-]*[ \t]*\n(.*?)\n?```", section, re.DOTALL))


def _python_block(section: str) -> Optional[str]:
    if section.count("```") != 2:
        return None
    return _only(re.findall(r"```python[ \t]*\n(.*?)\n?```", section, re.DOTALL))


def _answer_heading(section: str) -> Optional[str]:
    parts = re.split(r"^[ \t]*###[ \t]+Answer[ \t]*$", section, flags=re.MULTILINE | re.IGNORECASE)
    if len(parts) != 2:
        return None
    return _nonempty(next((line for line in parts[1].splitlines() if line.strip()), None))


def _markdown_table(section: str) -> Optional[str]:
    rows = [line.strip() for line in section.splitlines() if line.strip().startswith("|")]
    if len(rows) != 3 or not re.fullmatch(r"\|\s*:?-{3,}:?\s*\|", rows[1]):
        return None
    if [cell.strip().lower() for cell in rows[0].strip("|").split("|")] != ["answer"]:
        return None
    return _nonempty(rows[2].strip("|"))


def _numbered_item(section: str) -> Optional[str]:
    return _only(re.findall(r"^[ \t]*\d+\.[ \t]+(.+)$", section, re.MULTILINE))


def _bold(section: str) -> Optional[str]:
    return _only(re.findall(r"(?<!\*)\*\*([^*\n]+)\*\*(?!\*)", section))


def _italic(section: str) -> Optional[str]:
    return _only(re.findall(r"(?<!\*)\*([^*\n]+)\*(?!\*)", section))


MARKDOWN = [
    FormatSpec("markdown_code", "Put your answer in one fenced code block (``` ... ```), and use no other fence.",
               "```\nyour answer\n```", _markdown_code),
    FormatSpec("markdown_bold", "Write your answer once in bold, **like this**, and bold nothing else.",
               "**your answer**", _bold),
    FormatSpec("markdown_italic", "Write your answer once in italics, *like this*, and italicise nothing else.",
               "*your answer*", _italic),
    FormatSpec("markdown_answer_heading", 'Add one "### Answer" heading and write your answer on the next line.',
               "### Answer\nyour answer", _answer_heading),
    FormatSpec("markdown_table", 'Give your answer as a Markdown table with one column headed "Answer" and one row.',
               "| Answer |\n|---|\n| your answer |", _markdown_table),
    FormatSpec("markdown_numbered_item", 'Write your answer as a single numbered list item, "1. ...", and number '
               "nothing else.", "1. your answer", _numbered_item),
]


# -- structured documents (the whole response section) ------------------------------------------------
def _document(section: str) -> str:
    """The response section without surrounding whitespace or one enclosing code fence."""
    text = section.strip()
    fenced = re.fullmatch(r"```[\w+-]*[ \t]*\n(.*?)\n?```", text, re.DOTALL)
    return fenced.group(1).strip() if fenced else text


class _UniqueKeyLoader(yaml.SafeLoader):
    """YAML's safe loader, refusing a mapping that repeats a key (the answer given twice)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        keys = [self.construct_object(key, deep=deep) for key, _ in node.value]
        if len(keys) != len(set(map(str, keys))):
            raise yaml.constructor.ConstructorError(None, None, "a key is repeated", node.start_mark)
        return super().construct_mapping(node, deep=deep)


def _yaml(text: str) -> Any:
    return yaml.load(text, Loader=_UniqueKeyLoader)


def _scalar(value: Any) -> Optional[str]:
    if isinstance(value, (str, int, float)) and not isinstance(value, bool):
        return _nonempty(str(value))
    return None


def _confidence_ok(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and 0 <= value <= 1


def _parsed(loader: Callable[[str], Any], reader: Callable[[Any], Optional[str]]) -> Check:
    def check(section: str) -> Optional[str]:
        try:
            document = loader(_document(section))
        except Exception:  # any parser error means the format was not followed
            return None
        return reader(document)
    return check


def _mapping_answer(keys: set[str], confidence: bool = False) -> Callable[[Any], Optional[str]]:
    def read(document: Any) -> Optional[str]:
        if not isinstance(document, dict) or set(document) != keys:
            return None
        if confidence and not _confidence_ok(document["confidence"]):
            return None
        return _scalar(document["answer"])
    return read


def _single_item(document: Any) -> Optional[str]:
    return _scalar(document[0]) if isinstance(document, list) and len(document) == 1 else None


def _ini(text: str) -> Optional[str]:
    parser = configparser.ConfigParser()
    parser.read_string(text)
    sections = parser.sections()
    if len(sections) != 1 or list(parser[sections[0]]) != ["answer"]:
        return None
    return _nonempty(parser[sections[0]]["answer"])


def _env_line(text: str) -> Optional[str]:
    lines = [line for line in text.splitlines() if line.strip()]
    match = re.fullmatch(r'\s*ANSWER="([^"\n]+)"\s*', lines[0]) if len(lines) == 1 else None
    return _nonempty(match.group(1)) if match else None


def _xml(text: str) -> Optional[str]:
    root = ElementTree.fromstring(text)
    answers = list(root.iter("answer"))
    if root.tag != "response" or len(answers) != 1 or len(root) != 1:
        return None
    return _nonempty(answers[0].text)


def _csv(text: str) -> Optional[str]:
    rows = [row for row in csv.reader(io.StringIO(text)) if row]
    if len(rows) != 2 or [cell.strip().lower() for cell in rows[0]] != ["answer"] or len(rows[1]) != 1:
        return None
    return _nonempty(rows[1][0])


STRUCTURED = [
    FormatSpec("json", 'Reply with only a JSON object holding one key, "answer".', '{"answer": "your answer"}',
               _parsed(json.loads, _mapping_answer({"answer"}))),
    FormatSpec("json_array", "Reply with only a JSON array holding one element: your answer.", '["your answer"]',
               _parsed(json.loads, _single_item)),
    FormatSpec("json_simple", "Reply with only your answer as one JSON string.", '"your answer"',
               _parsed(json.loads, lambda d: _nonempty(d) if isinstance(d, str) else None)),
    FormatSpec("json_confidence", 'Reply with only a JSON object with the keys "answer" and "confidence" (a number '
               "from 0 to 1).", '{"answer": "your answer", "confidence": 0.8}',
               _parsed(json.loads, _mapping_answer({"answer", "confidence"}, confidence=True))),
    FormatSpec("json_nested", 'Reply with only a JSON object whose "response" object holds one key, "answer".',
               '{"response": {"answer": "your answer"}}',
               _parsed(json.loads, lambda d: _mapping_answer({"answer"})(d.get("response"))
                       if isinstance(d, dict) and set(d) == {"response"} else None)),
    FormatSpec("yaml", 'Reply with only a YAML mapping holding one key, "answer".', "answer: your answer",
               _parsed(_yaml, _mapping_answer({"answer"}))),
    FormatSpec("yaml_list", "Reply with only a YAML list of one item: your answer.", "- your answer",
               _parsed(_yaml, _single_item)),
    FormatSpec("yaml_confidence", 'Reply with only a YAML mapping with the keys "answer" and "confidence" (0 to 1).',
               "answer: your answer\nconfidence: 0.8",
               _parsed(_yaml, _mapping_answer({"answer", "confidence"}, confidence=True))),
    FormatSpec("toml", 'Reply with only a TOML document holding one key, answer.', 'answer = "your answer"',
               _parsed(tomllib.loads, _mapping_answer({"answer"}))),
    FormatSpec("toml_section", "Reply with only a TOML document with a [response] table holding one key, answer.",
               '[response]\nanswer = "your answer"',
               _parsed(tomllib.loads, lambda d: _mapping_answer({"answer"})(d.get("response"))
                       if set(d) == {"response"} else None)),
    FormatSpec("toml_confidence", "Reply with only a TOML document with the keys answer and confidence (0 to 1).",
               'answer = "your answer"\nconfidence = 0.8',
               _parsed(tomllib.loads, _mapping_answer({"answer", "confidence"}, confidence=True))),
    FormatSpec("ini_format", "Reply with only an INI file: one [section] holding one key, answer.",
               "[result]\nanswer = your answer", _parsed(_ini, lambda answer: answer)),
    FormatSpec("env_format", 'Reply with only one environment-variable line: ANSWER="...".', 'ANSWER="your answer"',
               _parsed(_env_line, lambda answer: answer)),
    FormatSpec("xml_document", "Reply with only an XML document: a <response> root holding one <answer> element.",
               "<response><answer>your answer</answer></response>", _parsed(_xml, lambda answer: answer)),
    FormatSpec("csv_format", 'Reply with only CSV: a header line "answer" and one line with your answer.',
               "answer\nyour answer", _parsed(_csv, lambda answer: answer)),
]


# -- programming-style answers ---------------------------------------------------------------------------
def code_format(value: str, pattern: str, shown: str, what: str, domain: str = "generic") -> FormatSpec:
    compiled = re.compile(pattern, re.DOTALL)

    def check(section: str) -> Optional[str]:
        return _only(compiled.findall(section))
    return FormatSpec(value, f"Give your answer once as {what}.", shown, check, domain)


STRING = r'"([^"\n]+)"'
PROGRAMMING = [
    code_format("function_call", rf"\banswer\(\s*{STRING}\s*\)", 'answer("your answer")', "a call answer(\"...\")"),
    code_format("variable_assignment", rf"\banswer\s*=\s*{STRING}", 'answer = "your answer"',
                'an assignment answer = "..."'),
    code_format("return_statement", rf"\breturn\s+{STRING}", 'return "your answer"', 'a statement return "..."'),
    code_format("python_print", rf"\bprint\(\s*{STRING}\s*\)", 'print("your answer")', 'a Python print("...")'),
    code_format("javascript_console", rf"\bconsole\.log\(\s*{STRING}\s*\)", 'console.log("your answer")',
                'a JavaScript console.log("...")'),
    code_format("shell_echo", rf"\becho\s+{STRING}", 'echo "your answer"', 'a shell command echo "..."'),
    code_format("c_comment", r"/\*(.*?)\*/", "/* your answer */", "a C block comment /* ... */"),
    code_format("html_comment", r"<!--(.*?)-->", "<!-- your answer -->", "an HTML comment <!-- ... -->"),
    code_format("python_docstring", r'def \w+\(\):\s*\n\s+"""(.*?)"""', 'def answer():\n    """your answer"""',
                'the docstring of a function with no arguments'),
    code_format("sql_select", r"SELECT\s+'([^'\n]+)'\s+AS\s+answer\s*;", "SELECT 'your answer' AS answer;",
                "a SQL statement SELECT '...' AS answer;"),
    symbol_format("shell_output", "$", domain="code_only"),
    FormatSpec("python_code_block", "Give your answer in one ```python fenced block and use no other fence.",
               "```python\nyour answer\n```", _python_block, "code_only"),
]


# -- multi-section layouts ----------------------------------------------------------------------------------
def sections_format(value: str, sections: tuple[str, ...], answer: str, domain: str = "generic",
                    numeric: Optional[str] = None) -> FormatSpec:
    """Every section, in this order, once and non-empty; `answer` names the section returned.
    `numeric` names a section that must hold a whole number from 1 to 10."""
    def check(section_text: str) -> Optional[str]:
        found: dict[str, str] = {}
        position = 0
        for name in sections:
            if len(re.findall(rf"<{name}>", section_text)) != 1 or len(re.findall(rf"</{name}>", section_text)) != 1:
                return None
            match = re.compile(rf"<{name}>(.*?)</{name}>", re.DOTALL).search(section_text, position)
            if match is None or not match.group(1).strip():
                return None
            found[name], position = match.group(1).strip(), match.end()
        if numeric and not (found[numeric].isdigit() and 1 <= int(found[numeric]) <= 10):
            return None
        return found[answer]
    layout = "\n".join(f"<{name}>{'7' if name == numeric else '...'}</{name}>" for name in sections)
    extra = f" <{numeric}> holds a whole number from 1 to 10." if numeric else ""
    return FormatSpec(value, f"Lay out your reply as these sections, in this order, each once and not empty: "
                             f"{', '.join(sections)}.{extra}", layout, check, domain, complex=True)


COMPLEX = [
    sections_format("complex_coding_workflow", ("UNDERSTANDING", "PLAN", "CODE", "TESTS"), "CODE", "code_only"),
    sections_format("complex_coding_review", ("PROBLEM", "APPROACH", "SOLUTION", "COMPLEXITY"), "SOLUTION",
                    "code_only"),
    sections_format("complex_debugging", ("SYMPTOM", "CAUSE", "FIX"), "FIX", "code_only"),
    sections_format("complex_math_derivation", ("GIVEN", "DERIVATION", "FINAL_ANSWER"), "FINAL_ANSWER", "math_only"),
    sections_format("complex_math_check", ("APPROACH", "CALCULATION", "CHECK", "FINAL_ANSWER"), "FINAL_ANSWER",
                    "math_only"),
    sections_format("complex_general_analysis", ("CONTEXT", "ANALYSIS", "CONCLUSION"), "CONCLUSION"),
    sections_format("complex_research", ("QUESTION", "EVIDENCE", "FINDINGS", "CONCLUSION"), "CONCLUSION"),
    sections_format("complex_decision", ("OPTIONS", "CRITERIA", "DECISION"), "DECISION"),
    sections_format("complex_pros_cons", ("PROS", "CONS", "RECOMMENDATION"), "RECOMMENDATION"),
    sections_format("complex_evaluation", ("CRITERIA", "ASSESSMENT", "SCORE", "VERDICT"), "VERDICT",
                    numeric="SCORE"),
    sections_format("complex_summary_answer", ("SUMMARY", "ANSWER"), "ANSWER"),
    sections_format("complex_claim_support", ("CLAIM", "SUPPORT", "COUNTERPOINT", "ANSWER"), "ANSWER"),
    sections_format("multiple_tags", ("theory", "answer", "explanation"), "answer"),
]


def _letter_choice(section: str) -> Optional[str]:
    return _only(re.findall(r"\[([A-Da-d])\]", section))


def _option_letter(section: str) -> Optional[str]:
    return _only(re.findall(r"\bOption \(([A-Z])\)", section))


SPECIAL = [
    FormatSpec("textarena_format", "Give your answer once as a letter in square brackets, like [B].", "[B]",
               _letter_choice),
    FormatSpec("option_letter", 'Give your answer once as "Option (X)" with X a capital letter.', "Option (B)",
               _option_letter),
]


def _catalogue() -> list[FormatSpec]:
    specs = [tag_format(value, tag) for value, tag in TAGS.items()]
    specs += [tag_format(f"html_{tag}", tag) for tag in HTML_TAGS]
    specs += [nested_format(outer, inner) for outer, inner in NESTED]
    specs += [label_format(value, label) for value, label in LABELS.items()]
    specs += [symbol_format(value, symbol) for value, symbol in SYMBOLS.items()]
    specs += [delimited_format(value, *parts) for value, parts in DELIMITERS.items()]
    specs += [command_format(value, command) for value, command in TEXT_COMMANDS.items()]
    specs += MATH_FORMATS + MARKDOWN + STRUCTURED + PROGRAMMING + COMPLEX + SPECIAL
    return specs


def _by_name(specs: list[FormatSpec]) -> dict[str, FormatSpec]:
    by_name: dict[str, FormatSpec] = {}
    for spec in specs:
        if spec.value in by_name:
            raise ValueError(f"answer format {spec.value!r} is defined twice")
        by_name[spec.value] = spec
    return by_name


FORMAT_SPECS: dict[str, FormatSpec] = _by_name(_catalogue())
AnswerFormat = Enum("AnswerFormat", {value.upper(): value for value in FORMAT_SPECS}, module=__name__)
AnswerFormat.__doc__ = "Every answer format of the catalogue (values are the format names)."


def spec_of(answer_format: "AnswerFormat") -> FormatSpec:
    return FORMAT_SPECS[answer_format.value]


def extract_answer(text: str, answer_format: "AnswerFormat") -> Optional[str]:
    """The answer `text` gives in `answer_format` after its thinking, or None if the rules are broken."""
    section = text_after_single_think_block(text)
    return None if section is None else spec_of(answer_format).check(section)
