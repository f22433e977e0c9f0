"""The reference's own API and packing tests pass, unmodified, against this server.

Needs the reference installed in its own virtual environment (``bench/setup_reference.sh``;
``ATROPOS_REFERENCE_PYTHON`` names its interpreter). Its tests start ``run-api`` on the
fixed port 8000 themselves, so this test is skipped when that port is taken.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

REFERENCE_PYTHON = Path(os.environ.get("ATROPOS_REFERENCE_PYTHON", "/opt/refvenv/bin/python"))
API_TESTS = ["test_api_legacy.py", "test_api_compression.py", "test_api_messages_handling.py"]
HELPER_TESTS = ["test_heterogeneous_batching.py", "test_heterogeneous_packing.py", "test_min_batch_allocation.py"]


def _reference_tests_dir() -> Path | None:
    if not REFERENCE_PYTHON.exists():
        return None
    found = subprocess.run(
        [str(REFERENCE_PYTHON), "-c", "import atroposlib, os; print(os.path.join(os.path.dirname(atroposlib.__file__), 'tests'))"],
        capture_output=True, text=True, cwd="/",  # not this checkout: it has an atroposlib too
    )
    return Path(found.stdout.strip()) if found.returncode == 0 else None


def _port_8000_free() -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", 8000)) != 0


@pytest.mark.slow
def test_reference_api_suite_passes(tmp_path: Path) -> None:
    source = _reference_tests_dir()
    if source is None:
        pytest.skip("reference atroposlib 0.4.0 not installed (bench/setup_reference.sh)")
    if not _port_8000_free():
        pytest.skip("the reference tests need port 8000")
    package = tmp_path / "reftests"
    package.mkdir()
    (package / "__init__.py").write_text("")
    for name in ["api_test_utils.py", "conftest.py", *API_TESTS]:
        shutil.copy(source / name, package / name)
    for name in HELPER_TESTS:
        shutil.copy(source / "test_utils" / name, package / name)
    for path in package.glob("*.py"):  # only their import path changes: they live outside the package here
        path.write_text(path.read_text().replace("atroposlib.tests.", "reftests."))
    env = {**os.environ, "ATROPOS_API_STATE_DIR": str(tmp_path / "state")}
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "addopts=", str(package)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    assert " passed" in result.stdout
