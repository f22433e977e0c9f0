"""The learning demo reads the trainer's step lines: what `console_line` prints, the demo parses
into the step's time budget (waiting for a batch, training, saving, syncing)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bench.learning_demo import Result, parse_step, step_budget
from example_trainer.reporting import console_line

STEP = {"loss": 0.01, "lr": 1e-5, "grad_norm": 0.5, "mean_ratio": 1.0, "clipped_fraction": 0.0, "mean_score": 0.5,
        "staleness/mean": 1.5, "staleness/max": 2, "data_fetch_time": 4.0, "step_time": 12.0, "checkpoint_time": 0.5,
        "sync_time": 1.5, "train/tokens_per_s": 150.0}


def test_the_demo_parses_the_trainers_step_line_into_its_budget() -> None:
    started = time.monotonic() - 30.0
    step = parse_step(console_line(STEP, 7), started)
    assert step is not None
    assert (step.step, step.batch_reward, step.staleness, step.positions_per_s) == (7, 0.5, 1.5, 150.0)
    assert (step.wait_time, step.step_time, step.save_time, step.sync_time) == (4.0, 12.0, 0.5, 1.5)
    without_sync = parse_step(console_line({**STEP, "checkpoint_time": 0.0, "sync_time": 0.0}, 8), started)
    assert without_sync is not None and (without_sync.save_time, without_sync.sync_time) == (0.0, 0.0)
    assert parse_step("waiting for batches from the environments (30 s so far)", started) is None


def test_the_budget_accounts_for_the_whole_run() -> None:
    started = time.monotonic() - 30.0
    steps = [parse_step(console_line(STEP, n), started) for n in (1, 2)]
    result = Result(cpu="cpu", cores=2, settings={}, steps=[s for s in steps if s is not None],
                    training_seconds=100.0, evaluation_seconds=20.0)
    budget = step_budget(result)
    assert budget["waiting for a batch"] == 8.0 and budget["training"] == 24.0
    assert budget["saving checkpoints"] == 1.0 and budget["weight sync"] == 3.0
    assert budget["start-up"] == pytest.approx(30.0 - 18.0, abs=0.5)
    assert sum(value for name, value in budget.items() if name != "evaluation") == pytest.approx(100.0)
    assert budget["evaluation"] == 20.0


@pytest.mark.parametrize("script", ["learning_demo.py", "trl_compare.py"])
def test_without_a_vllm_runtime_the_bench_says_so_in_one_line(script: str, tmp_path: Path) -> None:
    root = Path(__file__).resolve().parents[2]
    ran = subprocess.run([sys.executable, str(root / "bench" / script)], capture_output=True, text=True,
                         env={**os.environ, "ATROPOS_HOME": str(tmp_path)}, timeout=120)
    assert ran.returncode == 1
    assert "Traceback" not in ran.stderr
    assert ran.stderr.strip().splitlines() == [f"error: no vLLM runtime at {tmp_path / 'vllm-runtime'}: "
                                               "run `atropos-vllm install`"]
