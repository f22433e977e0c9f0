"""The code examples in the documentation run as written."""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import threading
from pathlib import Path

import httpx
from transformers import AutoTokenizer

from atroposlib.envs.server_handling.server_harness import TESTING_RESPONSE
from tests.conftest import env_registration, group
from tests.doc_blocks import doc_block
from tests.doc_commands import block_environment, command_line, mirror_of_repository
from tests.environments.scripted_inference import ScriptedInference
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


def _body(name: str) -> str:
    """The example file without its module docstring."""
    return (ROOT / "docs" / "examples" / f"{name}.py").read_text().split('"""', 2)[2].strip()


def test_readme_shows_the_example_verbatim() -> None:
    assert doc_block("README.md", "lease-loop").strip() == _body("lease_loop")


def _run_minimal_env(tmp_path: Path, tokenizer_dir: Path, start: str, replace: dict[str, str]) -> list[dict]:
    """The README's command starting with `start` (block minimal-env-run), run as written by bash in a
    mirror of the repository, `$MODEL` being the test tokenizer; the groups it wrote."""
    line = command_line("README.md", "minimal-env-run", start, replace)
    workdir = mirror_of_repository(tmp_path / "work")
    result = subprocess.run(["bash", "-euo", "pipefail", "-c", line], cwd=workdir, capture_output=True, text=True,
                            timeout=180, env=block_environment(tmp_path, MODEL=str(tokenizer_dir)))
    assert result.returncode == 0, result.stderr[-3000:]
    return [json.loads(line) for line in (workdir / "data" / "addition.jsonl").read_text().splitlines()]


def boxed_sum_half_right(prompt: str, index: int) -> str:
    """Even choices answer right in \\boxed{}, odd ones one off."""
    a, b = map(int, re.findall(r"What is (\d+) \+ (\d+)\?", prompt)[-1])
    return f"\\boxed{{{a + b + index % 2}}}"


def test_minimal_env_scores_right_and_wrong_answers_with_the_samplers_logprobs(tmp_path: Path,
                                                                               tokenizer_dir: Path) -> None:
    tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    with ScriptedInference(boxed_sum_half_right, tokenizer) as server:
        groups = _run_minimal_env(tmp_path, tokenizer_dir,
                                  "python docs/examples/minimal_env.py process --env.tokenizer_name",
                                  {"http://127.0.0.1:9001/v1": f"{server.url}/v1"})
    assert [group["scores"] for group in groups] == [[1.0, -1.0, 1.0, -1.0]] * 8  # total_steps 8: config_init's
    for written in groups:
        for tokens, masks, logprobs in zip(written["tokens"], written["masks"], written["inference_logprobs"]):
            assert len(tokens) == len(masks) == len(logprobs) and -100 in masks and masks[-1] != -100
            assert all(logprobs[i] <= 0 for i, mask in enumerate(masks) if mask != -100)


def test_minimal_env_runs_without_a_model_under_testing(tmp_path: Path, tokenizer_dir: Path) -> None:
    groups = _run_minimal_env(tmp_path, tokenizer_dir, "python docs/examples/minimal_env.py process --testing", {})
    assert [group["scores"] for group in groups] == [[-1.0] * 4] * 8  # kept: process mode keeps equal scores
    assert groups[0]["messages"][0][-1]["content"] == TESTING_RESPONSE


def test_readme_shows_the_minimal_env_verbatim() -> None:
    assert doc_block("README.md", "minimal-env").strip() == _body("minimal_env")
