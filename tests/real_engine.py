"""The real vLLM server (CPU build) on the bundled model, started once per test session.

Tests marked ``real_vllm`` need the runtime (``atropos-vllm install``) and are skipped
without it; `scripts/test.sh` installs it, so CI runs them. The fixtures are registered
once, in tests/conftest.py, so every directory's tests share one engine.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Iterator

import pytest

from atroposlib.local.prepare_model import prepare_model
from atroposlib.local.runtime import Runtime
from atroposlib.local.vllm_service import LocalVLLM

ROOT = Path(__file__).resolve().parent.parent


def installed_runtime() -> Runtime:
    runtime = Runtime()
    if not runtime.is_installed():
        pytest.skip(f"no vLLM runtime at {runtime.path} (run `atropos-vllm install`, or set ATROPOS_HOME)")
    return runtime


@pytest.fixture(scope="session")
def real_model_dir() -> Path:
    return prepare_model(runtime=installed_runtime())


@pytest.fixture(scope="session")
def real_vllm(real_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalVLLM]:
    log_path = Path(os.environ.get("PYTEST_TMPDIR") or tmp_path_factory.mktemp("vllm")) / "vllm.log"
    # float32 on every CPU: the trainer's float32 log-probabilities must match the sampler's
    with LocalVLLM(real_model_dir, runtime=installed_runtime(), log_path=log_path, dtype="float32") as server:
        yield server


@pytest.fixture(scope="session")
def gsm8k_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("reasoning_gym")
    import subprocess
    import sys

    folder = tmp_path_factory.mktemp("gsm8k_style")
    subprocess.run([sys.executable, str(ROOT / "environments" / "gsm8k_offline_data.py"), str(folder),
                    "--train", "20", "--test", "4"], check=True)
    return folder
