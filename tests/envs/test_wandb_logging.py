"""W&B logging with the real `wandb` package, offline: the run starts and the metric names are Atropos's."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.envs.conftest import env_command

pytest.importorskip("wandb")
pytestmark = pytest.mark.slow


def test_process_mode_logs_atropos_metric_names(tokenizer_dir: Path, inference_url: str, tmp_path: Path) -> None:
    flags = ["--env.tokenizer_name", str(tokenizer_dir), "--openai.base_url", inference_url,
             "--openai.model_name", "fake-model", "--env.use_wandb", "true", "--env.total_steps", "4",
             "--env.data_path_to_save_groups", str(tmp_path / "groups.jsonl")]
    environment = {**os.environ, "WANDB_MODE": "offline", "WANDB_DIR": str(tmp_path), "WANDB_SILENT": "true"}
    result = subprocess.run(env_command("process", *flags), cwd=tmp_path, capture_output=True, text=True,
                            timeout=180, env=environment)
    assert result.returncode == 0, result.stderr[-3000:]
    (run_file,) = list((tmp_path / "wandb").glob("offline-run-*/run-*.wandb"))
    logged = run_file.read_bytes()  # protobuf records keep metric names as plain bytes
    for name in (b"train/percent_correct", b"train/completion_lengths", b"train/completion_lengths_std",
                 b"train/rollouts", b"server/server_0_request_time_avg"):
        assert name in logged, name


def test_process_mode_without_a_key_logs_offline_with_one_line(tokenizer_dir: Path, inference_url: str,
                                                                 tmp_path: Path) -> None:
    flags = ["--env.tokenizer_name", str(tokenizer_dir), "--openai.base_url", inference_url,
             "--openai.model_name", "fake-model", "--env.total_steps", "2", "--env.use_wandb", "true",
             "--env.data_path_to_save_groups", str(tmp_path / "groups.jsonl")]
    environment = {name: value for name, value in os.environ.items()
                   if not name.startswith("WANDB_") and name != "NETRC"}
    environment.update(HOME=str(tmp_path), WANDB_DIR=str(tmp_path), WANDB_SILENT="true")
    result = subprocess.run(env_command("process", *flags), cwd=tmp_path, capture_output=True, text=True,
                            timeout=180, env=environment, stdin=subprocess.DEVNULL)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stderr.count("W&B: no API key") == 1
    assert list((tmp_path / "wandb").glob("offline-run-*"))


@pytest.mark.parametrize("variables, netrc_text, expected", [
    ({"WANDB_MODE": "disabled"}, None, None),  # the user's choice is left to wandb
    ({"WANDB_API_KEY": "k" * 40}, None, None),
    ({}, "machine api.wandb.ai\n  login user\n  password " + "k" * 40 + "\n", None),
    ({}, None, "offline"),
    ({"WANDB_BASE_URL": "https://wandb.example.org"}, "machine api.wandb.ai login u password p\n", "offline"),
])
def test_wandb_mode_is_offline_only_without_a_key(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                  variables: dict[str, str], netrc_text: str | None,
                                                  expected: str | None) -> None:
    from atroposlib.envs.wandb_logging import choose_wandb_mode

    for name in ("WANDB_MODE", "WANDB_API_KEY", "WANDB_BASE_URL"):
        monkeypatch.delenv(name, raising=False)
    for name, value in variables.items():
        monkeypatch.setenv(name, value)
    netrc_file = tmp_path / "netrc"
    if netrc_text is not None:
        netrc_file.write_text(netrc_text)
        netrc_file.chmod(0o600)
    monkeypatch.setenv("NETRC", str(netrc_file))
    assert choose_wandb_mode() == expected
