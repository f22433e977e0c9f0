"""Running the documentation's code blocks in tests: the environment they run in, and the
command lines of named blocks with documented substitutions.

The environment (`block_environment`, `mirror_of_repository`): the working directory is a
temporary folder holding a symbolic link to each top-level entry of the repository except
``data`` and hidden ones, so ``python docs/examples/...`` or ``bench/...`` resolve as in a clone
while whatever a block writes (``data/...``, output files) lands in the temporary folder.
``PATH`` starts with the project interpreter's folder (``python``, ``run-api``, ``atropos-*``);
``HOME`` and the XDG data, cache, config and state folders are in the temporary folder (state
dirs, spools and caches default there, never in the user's home); ``WANDB_MODE=disabled``,
``HF_HUB_OFFLINE=1``; ``ATROPOS_API_KEY`` is unset; the rest of the test's environment is kept
(``ATROPOS_HOME``: the vLLM runtime and prepared models CI installs).

Named blocks (`command`, `arguments`): a block's logical lines (backslash continuations
joined, blank and comment-only lines left out) are shell command lines. A test picks one by the
words it starts with, replaces literal text (a port such as ``8000`` by a free one, a URL by a
test server's) and expands ``$NAME`` / ``${NAME}`` from values it gives, as the shell would.
"""

from __future__ import annotations

import os
import re
import shlex
import sys
from pathlib import Path
from typing import Mapping, Optional

from tests.doc_blocks import ROOT, doc_block

_VARIABLE = re.compile(r"\$(?:\{(\w+)\}|(\w+))")


def mirror_of_repository(folder: Path) -> Path:
    """`folder`, holding a symbolic link to each top-level entry of the repository but ``data``
    and hidden ones; returned for use as a working directory."""
    folder.mkdir(parents=True, exist_ok=True)
    for entry in ROOT.iterdir():
        if entry.name.startswith(".") or entry.name == "data":
            continue
        (folder / entry.name).symlink_to(entry)
    return folder


def block_environment(folder: Path, **extra: str) -> dict[str, str]:
    """The process environment blocks run in (see the module docstring); `folder` holds the
    home and state folders."""
    home = folder / "home"
    environment = {key: value for key, value in os.environ.items() if key != "ATROPOS_API_KEY"}
    environment.update({
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        "HOME": str(home), "XDG_DATA_HOME": str(home / ".local" / "share"),
        "XDG_CACHE_HOME": str(home / ".cache"), "XDG_CONFIG_HOME": str(home / ".config"),
        "XDG_STATE_HOME": str(home / ".local" / "state"),
        "WANDB_MODE": "disabled", "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1",
    })
    environment.update(extra)
    return environment


def command_lines(path: str, name: str) -> list[str]:
    """The logical command lines of the block `name` in `path`."""
    lines: list[str] = []
    pending = ""
    for line in doc_block(path, name).splitlines():
        pending += line
        if line.rstrip().endswith("\\"):
            pending = pending.rstrip()[:-1] + " "
            continue
        if pending.strip() and not pending.strip().startswith("#"):
            lines.append(pending.strip())
        pending = ""
    return lines


def _expand(word: str, variables: Mapping[str, str]) -> str:
    def value(found: re.Match[str]) -> str:
        variable = found.group(1) or found.group(2)
        if variable not in variables:
            raise KeyError(f"the test gives no value for ${variable}")
        return variables[variable]

    return _VARIABLE.sub(value, word)


def command_line(path: str, name: str, start: str, replace: Optional[Mapping[str, str]] = None) -> str:
    """The one line of block `name` whose words begin with `start`, with `replace` applied."""
    words = start.split()
    found = [line for line in command_lines(path, name) if shlex.split(line, comments=True)[:len(words)] == words]
    if len(found) != 1:
        raise LookupError(f"{path} block {name!r} has {len(found)} lines starting with {start!r}, expected 1")
    line = found[0]
    for old, new in (replace or {}).items():
        if old not in line:
            raise LookupError(f"{old!r} is not in the line {line!r} of {path} block {name!r}")
        line = line.replace(old, new)
    return line


def command(path: str, name: str, start: str, replace: Optional[Mapping[str, str]] = None,
            variables: Optional[Mapping[str, str]] = None) -> list[str]:
    """The words of that line (comments dropped, quotes removed, variables expanded)."""
    line = command_line(path, name, start, replace)
    return [_expand(word, variables or {}) for word in shlex.split(line, comments=True)]


def arguments(path: str, name: str, start: str, replace: Optional[Mapping[str, str]] = None,
              variables: Optional[Mapping[str, str]] = None) -> list[str]:
    """The words of that line after `start`: the arguments of the program it starts."""
    return command(path, name, start, replace, variables)[len(start.split()):]


def readme_arguments(name: str, start: str, replace: Optional[Mapping[str, str]] = None,
                     **variables: str) -> list[str]:
    """`arguments` of a README.md block, the variables given as keywords (``MODEL=...``)."""
    return arguments("README.md", name, start, replace, variables)
