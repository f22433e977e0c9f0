"""The reference's own API and packing tests pass, unmodified, against this server.

Needs the reference installed in its own virtual environment (``bench/setup_reference.sh``;
``ATROPOS_REFERENCE_PYTHON`` names its interpreter). Its tests start ``run-api`` on the
fixed port 8000 themselves: the copies here use a free port instead.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers import free_port
from tests.reference_tests import copy_reference_tests, reference_tests_dir, run_reference_tests

API_TESTS = ["api_test_utils.py", "test_api_legacy.py", "test_api_compression.py", "test_api_messages_handling.py"]
HELPER_TESTS = ["test_utils/test_heterogeneous_batching.py", "test_utils/test_heterogeneous_packing.py",
                "test_utils/test_min_batch_allocation.py"]


@pytest.mark.slow
def test_reference_api_suite_passes(tmp_path: Path) -> None:
    source = reference_tests_dir()
    if source is None:
        pytest.skip("reference atroposlib 0.4.0 not installed (bench/setup_reference.sh)")
    package = copy_reference_tests(source, [*API_TESTS, *HELPER_TESTS], tmp_path, api_port=free_port())
    result = run_reference_tests(package, env={"ATROPOS_API_STATE_DIR": str(tmp_path / "state")})
    assert not result.failed, f"{result.summary()}; failed: {result.failed}\n{result.output}"
    assert not result.disallowed_skips(), result.disallowed_skips()
    assert result.passed, result.summary()
