"""The fenced code blocks of the project's documentation, and how each one is tested.

Every fenced block in a checked document is preceded (on the line just before its opening
fence, blank lines allowed between) by one marker comment saying how it is tested:

* ``<!-- doc-test: run -->``: `tests/test_doc_blocks.py` executes the block as written.
* ``<!-- doc-test: id=NAME -->``: a named block; some test reads it with
  ``doc_block(path, NAME)`` and runs it (for commands that start servers, need a free port,
  a Slurm cluster, a file written first, ...). A block whose name no test mentions fails.
* ``<!-- doc-test: gpu: REASON -->`` / ``<!-- doc-test: internet: REASON -->``: not run here,
  because it needs a GPU or the internet; the reason says what for.
* ``<!-- doc-test: output -->``: not code: printed output, a diagram or a directory tree.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CHECKED_DOCUMENTS = ("README.md", "SLURM.md", "environments/README.md")
KINDS = ("run", "id", "gpu", "internet", "output")

_MARKER = re.compile(r"<!--\s*doc-test:\s*(?P<body>.*?)\s*-->")
_FENCE = re.compile(r"^(?P<indent>\s*)(?P<fence>```+|~~~+)(?P<info>[^`]*)$")


@dataclass(frozen=True)
class DocBlock:
    """One fenced block: where it stands, its language, its text and its marker."""

    path: str
    line: int
    language: str
    text: str
    kind: str
    argument: str

    @property
    def where(self) -> str:
        return f"{self.path}:{self.line}"


def _parse_marker(body: str) -> tuple[str, str]:
    if body.startswith("id="):
        return "id", body[3:].strip()
    kind, _, argument = body.partition(":")
    return kind.strip(), argument.strip()


def doc_blocks(path: str) -> list[DocBlock]:
    """Every fenced block of `path` (relative to the repository root), in order."""
    lines = (ROOT / path).read_text().splitlines()
    blocks: list[DocBlock] = []
    marker: tuple[str, str] = ("", "")
    index = 0
    while index < len(lines):
        line = lines[index]
        found = _MARKER.search(line)
        if found:
            marker = _parse_marker(found.group("body"))
            index += 1
            continue
        opening = _FENCE.match(line)
        if not opening:
            if line.strip():
                marker = ("", "")
            index += 1
            continue
        fence, indent = opening.group("fence"), len(opening.group("indent"))
        body: list[str] = []
        index += 1
        while index < len(lines) and not lines[index].strip().startswith(fence):
            body.append(lines[index][indent:] if lines[index][:indent].strip() == "" else lines[index])
            index += 1
        blocks.append(DocBlock(path, index - len(body), opening.group("info").strip(), "\n".join(body) + "\n", *marker))
        marker = ("", "")
        index += 1
    return blocks


def doc_block(path: str, name: str) -> str:
    """The text of the block marked ``<!-- doc-test: id=NAME -->`` in `path`."""
    named = [block for block in doc_blocks(path) if block.kind == "id" and block.argument == name]
    if len(named) != 1:
        raise LookupError(f"{path} has {len(named)} blocks named {name!r}, expected 1")
    return named[0].text
