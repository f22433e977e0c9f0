"""Markdown tables of command-line flags, read from the code that defines them.

A `FlagDoc` is one documented flag: how it is spelled, its default as a reader should see
it, and what it means (its help text). `parser_docs` reads them from an argparse parser and
`field_docs` from the environment command line's flags (pydantic fields); `merged_docs` joins
the rows of tools that share most flags into one list that names each tool's own values;
`flag_table` renders rows as a Markdown table.

A default that is not a constant (it depends on the machine, the process environment or
other settings) is never printed as it happens to be here: `DocDefaults` holds the words
shown instead, by tool and flag, and an absolute path as a default is an error that asks
for such an entry.
"""

from __future__ import annotations

import argparse
import enum
import re
import typing
from dataclasses import dataclass
from pathlib import PurePath
from typing import Any, Iterable, Mapping, Optional

from atroposlib.utils.cli import Flag

MiB = 1024 * 1024
NO_DEFAULT = "–"

_STATED_DEFAULT = re.compile(r"\s*\(default: [^()]*(?:\([^()]*\)[^()]*)*\)")
_CODE_SPAN = re.compile(r"(`[^`]*`)")
_FLAG_WORD = re.compile(r"(?<![\w`-])(--[A-Za-z][\w.-]*\w)")
_ENV_VARIABLE = re.compile(r"(?<![\w`])(\$[A-Z][A-Z0-9_]*)")
_QUOTED_WORD = re.compile(r"(?<![\w`])'([^'\s]+)'(?!\w)")
_DOC_LINK = re.compile(r"CONFIG\.md#([a-z0-9_-]+)")
_OTHER_DOCUMENT = re.compile(r"(?<![\w/\[(])([A-Z]+\.md)(?![\w#\]])")
_TAG_START = re.compile(r"<(?=[A-Za-z/!?])")


class UndocumentedDefault(ValueError):
    """A default that would print this machine's value; it needs a `DocDefaults` entry."""


class DocDefaults:
    """The documented default of every flag whose default is not a constant, keyed by
    (tool, flag spelling); remembers which entries were used so stale ones can be reported."""

    def __init__(self, entries: Mapping[tuple[str, str], str]) -> None:
        self._entries = dict(entries)
        self._used: set[tuple[str, str]] = set()

    def get(self, tool: str, flag: str) -> Optional[str]:
        key = (tool, flag)
        if key in self._entries:
            self._used.add(key)
        return self._entries.get(key)

    def unused(self) -> list[tuple[str, str]]:
        return sorted(set(self._entries) - self._used)


@dataclass(frozen=True)
class FlagDoc:
    """One documented flag: its spellings, its default (Markdown) and its meaning (plain text)."""

    spellings: tuple[str, ...]
    default: str
    meaning: str
    group: str = ""

    @property
    def name(self) -> str:
        return self.spellings[0]


def _cell_value(value: Any) -> str:
    if isinstance(value, (list, tuple)):
        return " ".join(str(item) for item in value)
    return str(getattr(value, "value", value))


def format_default(tool: str, flag: str, value: Any, none_text: str) -> str:
    """A constant default as a Markdown cell: `2048`, `""`, `268435456` (256 MiB), or `none_text`."""
    if value is None:
        return none_text
    if isinstance(value, PurePath) and value.is_absolute() or isinstance(value, str) and value.startswith("/"):
        raise UndocumentedDefault(f"{tool} {flag}: the default {value} depends on this machine; "
                                  "give it a DOC_DEFAULTS entry in scripts/gen_config_md.py")
    if value == "":
        return '`""`'
    shown = f"`{_cell_value(value)}`"
    if isinstance(value, int) and not isinstance(value, bool) and "bytes" in flag and value >= MiB and value % MiB == 0:
        mebibytes = value // MiB
        size = f"{mebibytes // 1024} GiB" if mebibytes % 1024 == 0 else f"{mebibytes} MiB"
        shown += f" ({size})"
    return shown


def _with_choices(text: str, choices: Iterable[Any]) -> str:
    names = [_cell_value(choice) for choice in choices]
    if not names or all(re.search(rf"(?<![\w-]){re.escape(name)}(?![\w-])", text) for name in names):
        return text
    listed = ", ".join(f"'{name}'" for name in names)
    return f"{text.rstrip()} One of {listed}." if text.rstrip().endswith(".") else f"{text}; one of {listed}"


def _meaning(text: str, stated_elsewhere: bool) -> str:
    if stated_elsewhere:
        text = _STATED_DEFAULT.sub("", text)
    return " ".join(text.split())


def _annotation_choices(annotation: Any) -> tuple[Any, ...]:
    options = [arg for arg in typing.get_args(annotation) if arg is not type(None)] or [annotation]
    base = options[0]
    if typing.get_origin(base) is typing.Literal:
        return typing.get_args(base)
    if isinstance(base, type) and issubclass(base, enum.Enum):
        return tuple(member.value for member in base)
    return ()


def field_docs(tool: str, flags: Iterable[Flag], doc_defaults: DocDefaults) -> list[FlagDoc]:
    """Rows of the environment command line's flags (``None`` reads as ``null``, as in YAML)."""
    rows = []
    for flag in flags:
        spelling = f"--{flag.name}"
        documented = doc_defaults.get(tool, spelling)
        default = documented or format_default(tool, spelling, flag.default, "`null`")
        meaning = _with_choices(_meaning(flag.help, documented is not None), _annotation_choices(flag.annotation))
        rows.append(FlagDoc((spelling,), default, meaning))
    return rows


def _spellings(action: argparse.Action) -> tuple[str, ...]:
    if action.option_strings:
        return tuple(action.option_strings)
    metavar = action.metavar if isinstance(action.metavar, str) else action.dest.upper()
    return (metavar,)


def _argparse_default(action: argparse.Action) -> Optional[str]:
    """The Default cell of a required flag or a switch; None for flags that take a value."""
    if action.required:
        return "required"
    if isinstance(action, (argparse._StoreTrueAction, argparse._StoreFalseAction)):
        return "off" if action.default is False else "on"
    return None


def _help_text(parser: argparse.ArgumentParser, action: argparse.Action, documented: bool) -> str:
    text = action.help or ""
    # A "(default: %(default)s)" of the help repeats the Default column.
    text = re.sub(r"\s*\(default: %\(default\)s\)", "", text)
    params = {**vars(action), "prog": parser.prog, "default": action.default}
    return _meaning(text % params, documented)


def documented_actions(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    """The parser's flags and positional arguments shown in ``--help`` (no -h, no sub-commands)."""
    return [action for action in parser._actions
            if not isinstance(action, (argparse._HelpAction, argparse._SubParsersAction))
            and action.help != argparse.SUPPRESS]


def hidden_actions(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    """Flags the parser accepts but leaves out of ``--help``."""
    return [action for action in parser._actions if action.help == argparse.SUPPRESS]


def parser_docs(tool: str, parser: argparse.ArgumentParser, doc_defaults: DocDefaults) -> list[FlagDoc]:
    """Rows of an argparse parser's documented actions, with their argument-group titles."""
    groups = {id(action): group.title or "" for group in parser._action_groups for action in group._group_actions}
    rows = []
    for action in documented_actions(parser):
        spellings = _spellings(action)
        documented = doc_defaults.get(tool, spellings[0])
        fixed = _argparse_default(action)
        if documented is not None:
            default = documented
        elif fixed is not None:
            default = fixed
        else:
            default = format_default(tool, spellings[0], action.default, NO_DEFAULT)
        meaning = _with_choices(_help_text(parser, action, documented is not None), action.choices or ())
        rows.append(FlagDoc(spellings, default, meaning, groups.get(id(action), "")))
    return rows


def merged_docs(docs_by_tool: Mapping[str, list[FlagDoc]]) -> list[FlagDoc]:
    """One row per flag of any of the tools (in order of first appearance); a default or
    meaning that differs between them names each tool's, a flag some lack says whose it is."""
    order: list[str] = []
    found: dict[str, dict[str, FlagDoc]] = {}
    for label, docs in docs_by_tool.items():
        for doc in docs:
            if doc.name not in found:
                order.append(doc.name)
                found[doc.name] = {}
            found[doc.name][label] = doc
    rows = []
    for name in order:
        per_tool = found[name]
        first = next(iter(per_tool.values()))
        defaults = {label: doc.default for label, doc in per_tool.items()}
        meanings = {label: doc.meaning for label, doc in per_tool.items()}
        default = first.default if len(set(defaults.values())) == 1 else \
            ", ".join(f"{label} {value}" for label, value in defaults.items())
        meaning = first.meaning if len(set(meanings.values())) == 1 else \
            " ".join(f"{label}: {value}" for label, value in meanings.items())
        if len(per_tool) < len(docs_by_tool):
            meaning = f"{' and '.join(per_tool)} only: {_sentence_inside(meaning)}"
        spellings = tuple(dict.fromkeys(s for doc in per_tool.values() for s in doc.spellings))
        rows.append(FlagDoc(spellings, default, meaning, first.group))
    return rows


def _sentence_inside(text: str) -> str:
    """`text` continuing a sentence: a leading capital goes lower case, unless it starts an acronym."""
    if len(text) > 1 and text[0].isupper() and text[1].islower():
        return text[0].lower() + text[1:]
    return text


def markdown_text(text: str, anchors: Iterable[str] = ()) -> str:
    """Plain help text as a Markdown table cell: flags, ``$VARIABLES`` and 'quoted' words as
    code, ``CONFIG.md#anchor`` as a link to a heading of the document (`anchors`), another
    document of the repository root (``SLURM.md``) as a link to it."""
    known = set(anchors)
    parts = []
    for part in _CODE_SPAN.split(text):
        if part.startswith("`") and part.endswith("`") and len(part) > 1:
            parts.append(part.replace("|", "\\|"))
            continue
        part = _TAG_START.sub("&lt;", part.replace("|", "\\|"))
        part = _FLAG_WORD.sub(r"`\1`", part)
        part = _ENV_VARIABLE.sub(r"`\1`", part)
        part = _QUOTED_WORD.sub(r"`\1`", part)
        part = _OTHER_DOCUMENT.sub(r"[\1](\1)", part)
        parts.append(_DOC_LINK.sub(lambda match: _link(match.group(1), known), part))
    return "".join(parts)


def _link(anchor: str, known: set[str]) -> str:
    if anchor not in known:
        raise ValueError(f"a help text links to CONFIG.md#{anchor}, which is no heading of the document")
    return f"[{anchor.replace('-', ' ').capitalize()}](#{anchor})"


def flag_table(rows: list[FlagDoc], anchors: Iterable[str] = (), with_group: bool = False) -> str:
    """The rows as a Markdown table: Flag, Default, Meaning (and the group first, if asked)."""
    anchors = list(anchors)
    header = (["Group"] if with_group else []) + ["Flag", "Default", "Meaning"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in rows:
        if "(default:" in row.meaning:
            raise UndocumentedDefault(f"{row.name}: its help states a default the Default column does not show "
                                      f"({row.default}); give it a DOC_DEFAULTS entry in scripts/gen_config_md.py")
        cells = ([row.group] if with_group else []) + [
            ", ".join(f"`{spelling}`" for spelling in row.spellings),
            row.default.replace("|", "\\|"),
            markdown_text(row.meaning, anchors),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)
