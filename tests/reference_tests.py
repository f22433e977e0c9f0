"""Atropos 0.4.0's own unit tests, run unchanged against this project.

The reference wheel ships its tests inside the package (``atroposlib/tests``). They are
copied at test time from the reference installed in its own virtual environment
(``bench/setup_reference.sh``; ``ATROPOS_REFERENCE_PYTHON`` names its interpreter) into a
temporary package, never into this repository, and run by pytest in a child process with
the reference's pytest settings, so that they import this project's ``atroposlib``.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ElementTree
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

REPO = Path(__file__).resolve().parents[1]
REFERENCE_PYTHON = Path(os.environ.get("ATROPOS_REFERENCE_PYTHON", REPO / ".cache/refvenv/bin/python"))
# scripts/test.sh builds it: a venv with this project and transformers 4.
TRANSFORMERS4_PYTHON = Path(os.environ.get("ATROPOS_TRANSFORMERS4_PYTHON", REPO / ".cache/transformers4/bin/python"))
PACKAGE = "reftests"
# The reference's [tool.pytest.ini_options]; the loop scope only silences pytest-asyncio's warning.
REFERENCE_PYTEST_SETTINGS = ["-o", "asyncio_mode=auto", "-o", "asyncio_default_fixture_loop_scope=function"]
# Skips the rule allows: the test needs a GPU, an API key or the internet.
ALLOWED_SKIP = re.compile(r"gpu|api.?key|providers|internet", re.IGNORECASE)


@dataclass
class SuiteResult:
    """What one pytest run of reference tests did, test by test."""

    passed: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)
    output: str = ""

    def summary(self) -> str:
        return f"{len(self.passed)} passed, {len(self.failed)} failed, {len(self.skipped)} skipped"

    def disallowed_skips(self) -> dict[str, str]:
        """Skipped tests whose reason is not a GPU, an API key or the internet."""
        return {test: reason for test, reason in self.skipped.items() if not ALLOWED_SKIP.search(reason)}


def reference_tests_dir() -> Optional[Path]:
    """The ``tests`` folder of the installed reference package, or None when it is not installed."""
    if not REFERENCE_PYTHON.exists():
        return None
    found = subprocess.run(
        [str(REFERENCE_PYTHON), "-c",
         "import importlib.util, os; print(os.path.dirname(importlib.util.find_spec('atroposlib').origin))"],
        capture_output=True, text=True, cwd="/",  # not this checkout: it has an atroposlib too
    )
    folder = Path(found.stdout.strip()) / "tests"
    return folder if found.returncode == 0 and folder.is_dir() else None


def copy_reference_tests(source: Path, names: list[str], root: Path, api_port: Optional[int] = None) -> Path:
    """Copy `names` (paths inside the reference's tests folder) and its conftest into the
    package ``root/reftests``; return the package folder. Only their import path changes
    (``atroposlib.tests.`` becomes ``reftests.``, since they live outside the package here)
    and, with `api_port`, the fixed port 8000 their API runs on (``localhost:8000`` and the
    ``"--port", "8000"`` of the server they start)."""
    package = root / PACKAGE
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    for name in ["conftest.py", *names]:
        target = package / Path(name).name
        shutil.copy(source / name, target)
        text = target.read_text().replace("atroposlib.tests.", f"{PACKAGE}.")
        if api_port is not None:
            text = text.replace("localhost:8000", f"localhost:{api_port}").replace('"8000",', f'"{api_port}",')
        target.write_text(text)
    return package


def run_reference_tests(package: Path, python: Path = Path(sys.executable), env: Optional[dict[str, str]] = None,
                        timeout: float = 600) -> SuiteResult:
    """Run pytest on `package` with `python` (from its parent folder) and read its JUnit report."""
    report = package.parent / "report.xml"
    run_env = {**os.environ, "WANDB_MODE": "disabled", **(env or {})}
    completed = subprocess.run(
        [str(python), "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", "-o", "addopts=",
         *REFERENCE_PYTEST_SETTINGS, f"--junitxml={report}", str(package)],
        cwd=package.parent, env=run_env, capture_output=True, text=True, timeout=timeout,
    )
    result = SuiteResult(output=completed.stdout[-6000:] + completed.stderr[-3000:])
    if not report.exists():
        result.failed.append(f"pytest wrote no report (exit {completed.returncode})")
        return result
    for case in ElementTree.parse(report).getroot().iter("testcase"):
        test = f"{case.get('classname')}::{case.get('name')}"
        skipped = case.find("skipped")
        if case.find("failure") is not None or case.find("error") is not None:
            result.failed.append(test)
        elif skipped is not None:
            result.skipped[test] = skipped.get("message", "")
        else:
            result.passed.append(test)
    if completed.returncode not in (0, 5) and not result.failed:  # 5: nothing collected
        result.failed.append(f"pytest exited {completed.returncode}")
    return result


def offline_hub_cache(cache: Path, repo_id: str, tokenizer_folder: Path) -> Path:
    """A Hugging Face hub cache (``HF_HUB_CACHE``) in which `repo_id` resolves, with
    ``HF_HUB_OFFLINE=1``, to the files of `tokenizer_folder`; return `cache`.

    The repository is recorded as having no ``config.json``, so ``AutoTokenizer`` reads the
    tokenizer files alone instead of looking for a model config on the hub."""
    revision = "0" * 40
    repo = cache / f"models--{repo_id.replace('/', '--')}"
    snapshot = repo / "snapshots" / revision
    shutil.copytree(tokenizer_folder, snapshot)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(revision)
    missing = repo / ".no_exist" / revision
    missing.mkdir(parents=True)
    (missing / "config.json").touch()
    return cache


def set_eos_token(tokenizer_folder: Path, token: str) -> None:
    """Make `token` the end-of-sequence token of a saved tokenizer."""
    config_path = tokenizer_folder / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config["eos_token"] = token
    config_path.write_text(json.dumps(config, indent=2))
