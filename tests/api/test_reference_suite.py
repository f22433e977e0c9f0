"""The reference's own API and packing tests pass, unmodified, against this server.

Needs the reference installed in its own virtual environment (``bench/setup_reference.sh``;
``ATROPOS_REFERENCE_PYTHON`` names its interpreter). Its tests start ``run-api`` on the
fixed port 8000 themselves, so this test is skipped when that port is taken.
"""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from tests.reference_tests import copy_reference_tests, reference_tests_dir, run_reference_tests

API_TESTS = ["api_test_utils.py", "test_api_legacy.py", "test_api_compression.py", "test_api_messages_handling.py"]
HELPER_TESTS = ["test_utils/test_heterogeneous_batching.py", "test_utils/test_heterogeneous_packing.py",
                "test_utils/test_min_batch_allocation.py"]


def _port_8000_free() -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", 8000)) != 0


@pytest.mark.slow
def test_reference_api_suite_passes(tmp_path: Path) -> None:
    source = reference_tests_dir()
    if source is None:
        pytest.skip("reference atroposlib 0.4.0 not installed (bench/setup_reference.sh)")
    if not _port_8000_free():
        pytest.skip("the reference tests need port 8000")
    package = copy_reference_tests(source, [*API_TESTS, *HELPER_TESTS], tmp_path)
    result = run_reference_tests(package, env={"ATROPOS_API_STATE_DIR": str(tmp_path / "state")})
    assert not result.failed, f"{result.summary()}; failed: {result.failed}\n{result.output}"
    assert not result.disallowed_skips(), result.disallowed_skips()
    assert result.passed, result.summary()
