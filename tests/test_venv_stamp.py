"""`scripts/venv_stamp.sh`: a venv built from the same inputs is reused, and a `.venv` built
with more extras than asked for (CI's, then the quickstart's `EXTRAS=quickstart`) is not
installed again."""

from __future__ import annotations

import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def stamp(venv: Path, call: str) -> bool:
    """Whether `call` (a function of venv_stamp.sh, with its arguments) succeeds on `venv`."""
    script = f'source "{ROOT / "scripts" / "venv_stamp.sh"}"; {call}'
    return subprocess.run(["bash", "-c", script, "stamp", str(venv)], capture_output=True).returncode == 0


def built_venv(tmp_path: Path, *keys: str) -> Path:
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").write_text("#!/bin/sh\n")
    (venv / "bin" / "python").chmod(0o755)
    for key in keys:
        assert stamp(venv, f'write_stamp "$1" {key}')
    return venv


def test_asked_extras_among_the_built_ones_are_covered(tmp_path: Path) -> None:
    venv = built_venv(tmp_path, "abc123-dev,example-trainer,quickstart", "def456-games")
    for extras in ("quickstart", "dev", "quickstart,dev", "example-trainer"):
        assert stamp(venv, f'extras_covered "$1" abc123 {extras}'), extras


def test_an_extra_not_built_or_other_inputs_are_not_covered(tmp_path: Path) -> None:
    venv = built_venv(tmp_path, "abc123-dev,quickstart", "def456-games")
    assert not stamp(venv, 'extras_covered "$1" abc123 games')  # built, but from other inputs
    assert not stamp(venv, 'extras_covered "$1" abc123 dev,verifiers')
    assert not stamp(venv, 'extras_covered "$1" abc123 quick')  # a prefix of a built extra is another one
    assert not stamp(venv, 'extras_covered "$1" zzz999 dev')


def test_a_venv_without_python_or_stamp_is_not_reused(tmp_path: Path) -> None:
    assert not stamp(tmp_path / "missing", 'extras_covered "$1" abc123 dev')
    venv = built_venv(tmp_path)
    assert not stamp(venv, 'extras_covered "$1" abc123 dev')
    assert not stamp(venv, 'stamp_holds "$1" abc123-dev')
    built_venv(tmp_path / "other", "abc123-dev")
    assert stamp(tmp_path / "other" / "venv", 'stamp_holds "$1" abc123-dev')
