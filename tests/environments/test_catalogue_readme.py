"""environments/README.md is the catalogue: every environment is in its tables, and nothing in
them is made up. Text only (no environment is imported), so it runs in well under a second.

An environment file is a Python file under environments/ (fixtures excluded) that defines a
class whose base is an ``...Env`` class (``BaseEnv``, ``MathEvalEnv``, ``ImageQuestionEnv``,
...) and runs its CLI under ``if __name__ == "__main__"``. Files that only define a shared base
(``multimodal_dpo/image_qa.py``, ``eval_environments/eval_common.py``) must be named in the
README too, outside the tables.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ENVIRONMENTS = ROOT / "environments"
README = ENVIRONMENTS / "README.md"
NOT_PORTED_HEADING = "## Not ported"

CLASS_LINE = re.compile(r"^class\s+\w+\s*\(([^)]*)\)\s*:", re.MULTILINE)
ENV_BASE = re.compile(r"^(?:[\w.]+\.)?\w*Env$")
MAIN_GUARD = re.compile(r"^if\s+__name__\s*==\s*[\"']__main__[\"']\s*:", re.MULTILINE)
FIRST_CODE = re.compile(r"`([^`]+)`")
COMMAND = re.compile(r"`((?:\w+=\S+ )*python environments/[^`]+)`")


def _defines_env_class(text: str) -> bool:
    for bases in CLASS_LINE.findall(text):
        for base in bases.split(","):
            base = base.split("[")[0].strip()
            if "=" not in base and ENV_BASE.match(base):
                return True
    return False


def _env_files() -> tuple[set[str], set[str]]:
    """(runnable environment files, shared base files), relative to environments/."""
    runnable, bases = set(), set()
    for path in ENVIRONMENTS.rglob("*.py"):
        rel = path.relative_to(ENVIRONMENTS)
        if rel.parts[0] == "fixtures" or "__pycache__" in rel.parts:
            continue
        text = path.read_text(encoding="utf-8")
        if not _defines_env_class(text):
            continue
        (runnable if MAIN_GUARD.search(text) else bases).add(rel.as_posix())
    return runnable, bases


def _tables(text: str, first_header: str) -> list[list[str]]:
    """Rows (cells) of the tables whose header's first cell is `first_header`."""
    rows, inside = [], False
    for line in text.splitlines():
        if not line.startswith("|"):
            inside = False
            continue
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if cells[0] == first_header:
            inside = True
        elif inside and not set(cells[0]) <= set("-: "):
            rows.append(cells)
    return rows


def _path_of(first_cell: str) -> str:
    found = FIRST_CODE.search(first_cell)
    assert found, f"no `path` in the first cell {first_cell!r}"
    return found.group(1)


def _readme() -> tuple[str, str]:
    text = README.read_text(encoding="utf-8")
    assert NOT_PORTED_HEADING in text, f"{README} has no '{NOT_PORTED_HEADING}' section"
    catalogue, not_ported = text.split(NOT_PORTED_HEADING, 1)
    return catalogue, not_ported


def test_every_environment_file_is_in_the_catalogue_tables():
    runnable, _ = _env_files()
    assert len(runnable) >= 30, f"environment scan found only {sorted(runnable)}"
    catalogue, _ = _readme()
    listed = {_path_of(row[0]) for row in _tables(catalogue, "environment")}
    missing = sorted(runnable - listed)
    assert not missing, f"environments missing from environments/README.md's tables: {missing}"


def test_every_catalogue_row_is_complete_and_its_path_exists():
    catalogue, _ = _readme()
    rows = _tables(catalogue, "environment")
    assert rows, "environments/README.md has no catalogue table (header cell 'environment')"
    for row in rows:
        path = _path_of(row[0])
        assert len(row) == 8, f"{path}: expected 8 cells, got {len(row)}"
        assert all(row), f"{path}: empty cell in {row}"
        assert (ENVIRONMENTS / path).is_file(), f"the catalogue lists environments/{path}, which does not exist"
    paths = [_path_of(row[0]) for row in rows]
    assert len(paths) == len(set(paths)), "an environment is listed twice"


def test_shared_environment_bases_are_named():
    _, bases = _env_files()
    text = README.read_text(encoding="utf-8")
    unnamed = sorted(base for base in bases if f"`{base}`" not in text)
    assert not unnamed, f"shared environment bases not named in environments/README.md: {unnamed}"


def test_paths_in_the_commands_exist():
    catalogue, _ = _readme()
    commands = COMMAND.findall(catalogue)
    assert len(commands) >= 60
    for command in commands:
        for word in shlex.split(command.replace("$", "")):
            if word.startswith("environments/"):
                assert (ROOT / word).exists(), f"{word} (in `{command}`) does not exist"


def test_not_ported_entries_have_a_reason_and_no_file_here():
    _, not_ported = _readme()
    rows = _tables(not_ported, "Atropos path")
    assert len(rows) >= 30, "the 'Not ported' table looks truncated"
    for row in rows:
        path = _path_of(row[0])
        assert row[-1], f"{path}: no reason given"
        assert not (ENVIRONMENTS / path).exists(), (
            f"environments/{path} exists: move it from 'Not ported' to the catalogue tables")
