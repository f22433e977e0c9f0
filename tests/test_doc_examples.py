"""The code examples in the documentation run as written."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import httpx

from atroposlib.envs.server_handling.server_harness import TESTING_RESPONSE
from tests.conftest import env_registration, group
from tests.envs.conftest import start_fake_inference
from tests.helpers import ApiProcess

ROOT = Path(__file__).resolve().parent.parent


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "docs" / "examples" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_lease_loop_example_trains_on_every_batch(tmp_path: Path) -> None:
    example = _load("lease_loop")
    with ApiProcess(tmp_path / "state") as api:
        result: list[int] = []
        trainer = threading.Thread(target=lambda: result.append(example.run_trainer(api.url, steps=3)))
        trainer.start()
        while not httpx.get(api.url + "/health").json()["started"]:
            pass
        env = httpx.post(api.url + "/register-env", json=env_registration("demo", 8)).json()
        for score in range(6):
            httpx.post(api.url + "/scored_data", json=group(8, env_id=env["env_id"], score=score)).raise_for_status()
        trainer.join(60)
        assert result == [3]


def test_readme_shows_the_example_verbatim() -> None:
    example = (ROOT / "docs" / "examples" / "lease_loop.py").read_text()
    body = example.split('"""', 2)[2].strip()
    assert body in (ROOT / "README.md").read_text()


def _run_minimal_env(tmp_path: Path, tokenizer_dir: Path, *flags: str) -> list[dict]:
    out = tmp_path / "groups.jsonl"
    command = [sys.executable, str(ROOT / "docs" / "examples" / "minimal_env.py"), "process", "--env.total_steps", "2",
               "--env.tokenizer_name", str(tokenizer_dir), "--env.data_path_to_save_groups", str(out), *flags]
    result = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=180,
                            env={**os.environ, "WANDB_MODE": "disabled"})
    assert result.returncode == 0, result.stderr[-3000:]
    return [json.loads(line) for line in out.read_text().splitlines()]


def test_minimal_env_scores_right_and_wrong_answers(tmp_path: Path, tokenizer_dir: Path) -> None:
    inference, url = start_fake_inference()
    try:  # the fake server answers even-numbered choices right and odd ones off by one
        groups = _run_minimal_env(tmp_path, tokenizer_dir, "--openai.base_url", url, "--openai.model_name", "m")
    finally:
        inference.terminate()
        inference.wait(10)
    assert [group["scores"] for group in groups] == [[1.0, -1.0, 1.0, -1.0]] * 2
    for group in groups:
        assert all(-100 in masks and masks[-1] != -100 for masks in group["masks"])


def test_minimal_env_runs_without_a_model_under_testing(tmp_path: Path, tokenizer_dir: Path) -> None:
    groups = _run_minimal_env(tmp_path, tokenizer_dir, "--testing")
    assert [group["scores"] for group in groups] == [[-1.0] * 4] * 2  # kept: process mode keeps equal scores
    assert groups[0]["messages"][0][-1]["content"] == TESTING_RESPONSE


def test_readme_shows_the_minimal_env_verbatim() -> None:
    example = (ROOT / "docs" / "examples" / "minimal_env.py").read_text()
    body = example.split('"""', 2)[2].strip()
    assert body in (ROOT / "README.md").read_text()
