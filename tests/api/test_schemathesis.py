"""The API answers as its OpenAPI document says: Schemathesis, with every check on,
against a real ``run-api --ephemeral`` process, finds nothing.

Two servers: the default (``--validation warn``, no key) and a locked-down one
(``--validation strict --api-key``), so both group schemas, the 401s and the 415s are
covered. The number of examples per operation is bounded to keep each run to a minute
or two on a 2-core CPU; the seed is fixed so a failure reproduces.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import ApiProcess

REPO = Path(__file__).resolve().parents[2]
MAX_EXAMPLES = 25
SEED = 20261123
API_KEY = "contract-test-key"


def run_schemathesis(url: str, workdir: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "SCHEMATHESIS_HOOKS": "tests.api.schemathesis_hooks",
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
    }
    return subprocess.run(
        [
            sys.executable, "-m", "schemathesis.cli", "run", f"{url}/openapi.json",
            "--checks", "all", "--max-examples", str(MAX_EXAMPLES), "--seed", str(SEED),
            "--no-color", "--request-timeout", "30", *extra,
        ],
        cwd=workdir, env=env, capture_output=True, text=True, timeout=900,
    )


def _report(result: subprocess.CompletedProcess[str]) -> str:
    return result.stdout[-8000:] + result.stderr[-2000:]


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_default_server_matches_its_contract(tmp_path: Path) -> None:
    with ApiProcess(None, "--ephemeral", "--log-level", "warning") as api:
        result = run_schemathesis(api.url, tmp_path)
    assert result.returncode == 0, _report(result)
    assert " passed" in result.stdout, _report(result)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_strict_server_with_api_key_matches_its_contract(tmp_path: Path) -> None:
    with ApiProcess(
        None, "--ephemeral", "--log-level", "warning", "--validation", "strict", "--api-key", API_KEY
    ) as api:
        result = run_schemathesis(api.url, tmp_path, "--header", f"Authorization: Bearer {API_KEY}")
    assert result.returncode == 0, _report(result)
    assert " passed" in result.stdout, _report(result)
