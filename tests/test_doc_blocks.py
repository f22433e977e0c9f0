"""Every fenced block of the checked documents (`tests.doc_blocks.CHECKED_DOCUMENTS`) says how
it is tested, and every ``run`` block runs as written.

The markers: each block has one (``tests/doc_blocks.py`` defines them); its kind is one of
`KINDS`; ``gpu`` and ``internet`` give a reason; an ``id=NAME`` is unique in its document and
some test file (any file under tests/ but the block parser and this file) mentions ``"NAME"``
in quotes, as the argument it gives ``doc_block`` or the helpers of ``tests/doc_commands.py``.

The ``run`` blocks: each is written to a file and run with a time limit of `RUN_TIMEOUT_S`,
bash blocks (``bash``, ``sh``, ``shell``) as ``bash -euo pipefail FILE``, python blocks with the
project's interpreter (`sys.executable`), in the environment ``tests/doc_commands.py``
describes: the working directory is a temporary folder that mirrors the repository's top-level
entries by symbolic links (so relative paths such as ``docs/examples/...`` resolve) and receives
what the block writes; ``PATH`` starts with the project's ``.venv/bin``; ``HOME`` and the XDG
folders are in the temporary folder; ``WANDB_MODE=disabled``, ``HF_HUB_OFFLINE=1``. A block
that fails names its document and line, with its exit status and output.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.doc_blocks import CHECKED_DOCUMENTS, KINDS, ROOT, DocBlock, doc_blocks
from tests.doc_commands import block_environment, mirror_of_repository

RUN_TIMEOUT_S = 300
BASH = ("bash", "sh", "shell")
PYTHON = ("python", "py", "python3")
NOT_CHECKED_FOR_NAMES = ("doc_blocks.py", "test_doc_blocks.py")

BLOCKS = [block for document in CHECKED_DOCUMENTS if (ROOT / document).exists() for block in doc_blocks(document)]
RUN_BLOCKS = [block for block in BLOCKS if block.kind == "run"]


def _test_sources() -> str:
    return "\n".join(path.read_text(encoding="utf-8", errors="replace") for path in (ROOT / "tests").rglob("*.py")
                     if path.name not in NOT_CHECKED_FOR_NAMES)


@pytest.fixture(scope="module")
def test_sources() -> str:
    return _test_sources()


@pytest.mark.parametrize("document", CHECKED_DOCUMENTS)
def test_each_checked_document_exists_and_has_blocks(document: str) -> None:
    assert (ROOT / document).is_file(), f"{document} is missing"
    assert doc_blocks(document), f"{document} has no fenced block: is the parser reading the right file?"


@pytest.mark.parametrize("block", BLOCKS, ids=[block.where for block in BLOCKS])
def test_the_block_has_a_valid_marker(block: DocBlock, test_sources: str) -> None:
    assert block.kind, f"{block.where}: no <!-- doc-test: ... --> marker on the line before the block"
    assert block.kind in KINDS, f"{block.where}: marker kind {block.kind!r} is not one of {KINDS}"
    if block.kind in ("gpu", "internet"):
        assert block.argument, f"{block.where}: a {block.kind} block says why: <!-- doc-test: {block.kind}: REASON -->"
    if block.kind == "id":
        assert block.argument, f"{block.where}: id= without a name"
        same = [other.where for other in doc_blocks(block.path)
                if other.kind == "id" and other.argument == block.argument]
        assert len(same) == 1, f"{block.where}: the name {block.argument!r} is used by {same}"
        quoted = (f'"{block.argument}"', f"'{block.argument}'")
        assert any(name in test_sources for name in quoted), (
            f"{block.where}: no test mentions the block name {block.argument!r}: none runs it")
    if block.kind == "run":
        assert block.language in BASH + PYTHON, (
            f"{block.where}: a run block must be bash or python, not {block.language or 'unlabelled'}")


def _run(block: DocBlock, folder: Path) -> tuple[int, str]:
    """Exit status and output of the block; the block's whole process group is killed at the end,
    so nothing it started in the background outlives it."""
    workdir = mirror_of_repository(folder / "work")
    if block.language in BASH:
        script = folder / "block.sh"
        command = ["bash", "-euo", "pipefail", str(script)]
    else:
        script = folder / "block.py"
        command = [sys.executable, str(script)]
    script.write_text(block.text)
    log = folder / "block.log"  # a file, not a pipe: a process left in the background may hold it open
    with open(log, "wb") as output:
        process = subprocess.Popen(command, cwd=workdir, env=block_environment(folder), stdin=subprocess.DEVNULL,
                                   stdout=output, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        process.wait(RUN_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{block.where}: still running after {RUN_TIMEOUT_S} s\n{log.read_text(errors='replace')[-4000:]}")
    finally:
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        process.wait()
    return process.returncode, log.read_text(errors="replace")


if RUN_BLOCKS:  # none at present: every block is run by a named test (id=...)
    @pytest.mark.parametrize("block", RUN_BLOCKS, ids=[block.where for block in RUN_BLOCKS])
    def test_the_run_block_runs_as_written(block: DocBlock, tmp_path: Path) -> None:
        status, output = _run(block, tmp_path)
        assert status == 0, f"{block.where}: exit status {status}\n{output[-6000:]}"


def test_the_executor_runs_blocks_in_the_documented_environment_and_stops_what_they_leave(tmp_path: Path) -> None:
    bash = DocBlock("README.md", 1, "bash", f"""test "$(command -v run-api)" = "{Path(sys.executable).parent}/run-api"
test "$HOME" = "{tmp_path}/home" && test "$WANDB_MODE" = disabled && test -f docs/examples/minimal_env.py
sleep 600 & echo $! > sleeper.pid
echo written > out.txt
""", "run", "")
    assert _run(bash, tmp_path) == (0, "")
    assert (tmp_path / "work" / "out.txt").read_text() == "written\n" and not (ROOT / "out.txt").exists()
    sleeper = int((tmp_path / "work" / "sleeper.pid").read_text())
    deadline = time.monotonic() + 10
    while Path(f"/proc/{sleeper}").exists() and "Z" not in Path(f"/proc/{sleeper}/stat").read_text().split()[2]:
        assert time.monotonic() < deadline, "a process the block left in the background still runs"
        time.sleep(0.05)
    python = DocBlock("README.md", 1, "python", "import atroposlib, os\nprint(os.getcwd())\n", "run", "")
    assert _run(python, tmp_path / "python") == (0, f"{tmp_path / 'python' / 'work'}\n")
    failing = DocBlock("README.md", 1, "bash", "echo before\nfalse\necho after\n", "run", "")
    assert _run(failing, tmp_path / "failing") == (1, "before\n")  # -e: the first failure stops the block
