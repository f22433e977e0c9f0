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
