"""The README's install gives what Atropos's core install gives: an Atropos-style env file runs after it.

A fresh virtual environment, ``pip install <checkout>`` as the README says (no extras; uv runs it
with pip's configuration where uv is at hand: atroposlib/local/installer.py), then an
environment file that imports ``datasets``, ``wandb``, ``tqdm`` and ``math_verify`` at the top,
as Atropos's own environment files do, writes scored groups in ``process`` mode.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import venv
from pathlib import Path

import pytest

from atroposlib.local.installer import install_command
from tests.doc_commands import command
from tests.envs.conftest import ROOT

# the first test also waits for the module's fresh install (pip, where uv is missing, may take up to 1200 s
# on a busy machine): the suite's 300 s per test would count that wait against it
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1500)]

ENV_FILE = ROOT / "tests" / "envs" / "atropos_style" / "dataset_env.py"


@pytest.fixture(scope="module")
def fresh_install(tmp_path_factory: pytest.TempPathFactory) -> Path:
    target = tmp_path_factory.mktemp("fresh") / "venv"
    venv.create(target, with_pip=True)
    python = target / "bin" / "python"
    # the README's install, in the clone, run by uv with pip's configuration where uv is at hand (as
    # scripts/setup.sh does): the releases pip takes (tests/local/test_installer.py), in a tenth of pip's time;
    # without bytecode, only the modules the tests import are compiled (when imported): the same files installed
    pip, verb, *requirements = command("README.md", "pip-install", "pip install")
    installing = install_command(python, [str(ROOT) if each == "." else each for each in requirements], bytecode=False)
    try:
        installing.run()
    except subprocess.CalledProcessError as failed:
        pytest.fail(f"{installing.shown()} failed with exit status {failed.returncode}")
    return python


def test_core_install_has_no_torch_and_imports_what_atropos_envs_use(fresh_install: Path) -> None:
    modules = ["datasets", "aiohttp", "aiofiles", "jsonlines", "wandb", "gymnasium", "rich", "nltk", "polars",
               "math_verify", "transformers", "openai", "tenacity", "markdown", "jinja2", "numpy", "tqdm"]
    probe = (f"import importlib.util, sys; import {', '.join(modules)}; "
             "sys.exit(importlib.util.find_spec('torch') is not None)")
    result = subprocess.run([str(fresh_install), "-c", probe], capture_output=True, text=True, timeout=300, cwd="/")
    assert result.returncode == 0, result.stderr[-2000:] or "torch is installed by the core install"


def test_atropos_style_env_importing_datasets_runs(fresh_install: Path, tokenizer_dir: Path, inference_url: str,
                                                   tmp_path: Path) -> None:
    problems = tmp_path / "problems.jsonl"
    problems.write_text("".join(json.dumps({"question": f"What is {a} + {a + 1}?", "answer": 2 * a + 1}) + "\n"
                                for a in range(6)))
    out = tmp_path / "groups.jsonl"
    command = [str(fresh_install), str(ENV_FILE), "process", "--env.dataset_path", str(problems),
               "--env.tokenizer_name", str(tokenizer_dir), "--env.data_path_to_save_groups", str(out),
               "--openai.base_url", inference_url, "--openai.model_name", "fake-model"]
    environment = {**os.environ, "WANDB_MODE": "disabled", "HF_HUB_OFFLINE": "1",
                   "HF_DATASETS_CACHE": str(tmp_path / "datasets-cache")}
    result = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=300, env=environment)
    assert result.returncode == 0, result.stderr[-3000:]
    groups = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(groups) == 4
    for group in groups:  # the fake server answers even-numbered choices right, odd ones off by one
        assert group["scores"] == [1.0, -1.0, 1.0, -1.0]
        assert len(group["tokens"]) == len(group["masks"]) == 4
    assert sys.executable != str(fresh_install)
