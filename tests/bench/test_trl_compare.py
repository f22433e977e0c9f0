"""The TRL race's bookkeeping: stored runs are reused only with the same settings and CPU, the
seeds' curves are summarised as mean and min–max, the time to TRL's final accuracy is read
off the mean curves, and a stopped race stops the run under way with what it started."""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from bench.trl_compare import SHARED, curve, reach_time, report, run_file, stored_run, summary

SETTINGS = {"steps": 10, "lr": 1e-5, "group_size": 8, "groups_per_step": 4, "temperature": 0.7, "eval_every": 5,
            "eval_samples": 8, "eval_pairs": 30, "split_seed": 1234, "eval_seed": 0, "max_answer_tokens": 32,
            "eval_dtype": "auto"}


def race_args(**changes: Any) -> argparse.Namespace:
    ours = {"ours_sync_every": 1, "ours_trainer_flag": [], "ours_env_flag": [], "trl_precision": "default"}
    return argparse.Namespace(**(SETTINGS | ours | changes))


def run(side: str, seed: int, points: list[tuple[int, float, float]], dtype: str = "bfloat16") -> dict[str, Any]:
    """A stored run: (step, seconds, accuracy) per evaluation."""
    stored: dict[str, Any] = {"cpu": "Xeon", "cores": 2, "training_seconds": points[-1][1] + 5,
                              "settings": SETTINGS | {"seed": seed, "dtype": dtype},
                              "evaluations": [{"step": step, "seconds": seconds, "accuracy": accuracy, "answers": 240}
                                              for step, seconds, accuracy in points]}
    if side == "trl":
        stored["side"] = "trl"
    return stored


def test_every_shared_setting_is_checked() -> None:
    assert set(SETTINGS) == set(SHARED)


def test_a_stored_run_is_reused_only_with_the_same_settings_seed_and_cpu(tmp_path: Path,
                                                                         capsys: pytest.CaptureFixture[str]) -> None:
    path = run_file(tmp_path, "trl", 1)
    path.write_text(json.dumps(run("trl", 1, [(0, 0, 0.4)])))
    assert stored_run(path, race_args(), 1, "Xeon") is not None
    assert stored_run(path, race_args(), 2, "Xeon") is None
    assert stored_run(path, race_args(eval_pairs=20), 1, "Xeon") is None
    assert "'eval_pairs': 30" in capsys.readouterr().out
    assert stored_run(path, race_args(), 1, "EPYC") is None
    assert "made on Xeon" in capsys.readouterr().out
    assert stored_run(tmp_path / "missing.json", race_args(), 1, "Xeon") is None


def test_a_run_stored_before_the_evaluation_dtype_was_recorded_was_evaluated_in_auto(tmp_path: Path) -> None:
    path = run_file(tmp_path, "trl", 0)
    stored = run("trl", 0, [(0, 0, 0.4)])
    del stored["settings"]["eval_dtype"]
    path.write_text(json.dumps(stored))
    assert stored_run(path, race_args(), 0, "Xeon") is not None
    assert stored_run(path, race_args(eval_dtype="float32"), 0, "Xeon") is None


def test_a_stored_run_of_ours_is_reused_only_with_the_same_trainer_and_environment_flags(tmp_path: Path) -> None:
    path = run_file(tmp_path, "ours-keep", 0)
    stored = run("ours-keep", 0, [(0, 0, 0.4)])
    stored["settings"] |= {"sync_every": 1, "trainer_flag": []}
    path.write_text(json.dumps(stored))
    assert stored_run(path, race_args(), 0, "Xeon") is not None
    assert stored_run(path, race_args(ours_trainer_flag=["--max-prefetch-batches=1"]), 0, "Xeon") is None
    assert stored_run(path, race_args(ours_sync_every=2), 0, "Xeon") is None
    # a run stored before environment flags were recorded had none
    assert stored_run(path, race_args(ours_env_flag=["--env.max_batches_offpolicy=1"]), 0, "Xeon") is None
    stored["settings"] |= {"env_flag": ["--env.max_batches_offpolicy=1"]}
    path.write_text(json.dumps(stored))
    assert stored_run(path, race_args(ours_env_flag=["--env.max_batches_offpolicy=1"]), 0, "Xeon") is not None


def test_the_curve_is_the_mean_and_spread_over_seeds_at_each_evaluated_step() -> None:
    runs = [run("trl", 0, [(0, 0, 0.4), (5, 100, 0.6), (10, 200, 0.8)]),
            run("trl", 1, [(0, 0, 0.5), (5, 120, 0.7), (10, 220, 0.9)])]
    points = curve(runs)
    assert [point["step"] for point in points] == [0, 5, 10]
    assert points[1]["accuracy"] == pytest.approx({"mean": 0.65, "min": 0.6, "max": 0.7})
    assert points[2]["seconds"] == pytest.approx({"mean": 210, "min": 200, "max": 220})


def test_the_time_to_a_target_is_interpolated_between_checkpoints() -> None:
    assert reach_time([(0, 0.4), (100, 0.6), (200, 0.8)], 0.7) == pytest.approx(150)
    assert reach_time([(0, 0.9), (100, 0.6)], 0.8) == 0
    assert reach_time([(0, 0.4), (100, 0.6)], 0.7) is None


def test_the_report_gives_each_side_its_ratio_to_trls_time_and_where_it_falls_behind() -> None:
    trl = [run("trl", seed, [(0, 0, 0.4), (5, 100, 0.7 + seed / 100), (10, 200, 0.8)], dtype="bfloat16 autocast")
           for seed in range(2)]
    fast = [run("ours-drop", seed, [(0, 0, 0.4), (5, 40, 0.8), (10, 80, 0.85)]) for seed in range(2)]
    slow = [run("ours-keep", seed, [(0, 0, 0.4), (5, 150, 0.5), (10, 300, 0.8)]) for seed in range(2)]
    result = report(race_args(), {"ours-keep": slow, "trl": trl, "ours-drop": fast})
    assert result["target"] == pytest.approx(0.8)
    assert result["sides"]["trl"]["reach_seconds"] == pytest.approx(200)
    assert result["sides"]["ours-drop"]["ratio_to_trl"] == pytest.approx(40 / 200)
    assert result["sides"]["ours-keep"]["ratio_to_trl"] == pytest.approx(300 / 200)
    assert result["sides"]["ours-keep"]["behind_trl_beyond_spread"] == [5]
    assert result["sides"]["ours-drop"]["behind_trl_beyond_spread"] == []
    assert result["sides"]["ours-drop"]["dtype"] == "bfloat16 compute, float32 masters"
    assert result["sides"]["trl"]["dtype"] == "bfloat16 autocast"
    text = summary(result)
    assert "0.20x TRL's time" in text and "1.50x TRL's time" in text and "behind TRL beyond the seeds' spread" in text


def test_a_stored_trl_run_is_reused_only_in_the_precision_asked_for(tmp_path: Path) -> None:
    path = run_file(tmp_path, "trl", 0)
    path.write_text(json.dumps(run("trl", 0, [(0, 0, 0.4), (10, 300, 0.8)], dtype="bfloat16 autocast")))
    assert stored_run(path, race_args(), 0, "Xeon") is not None  # stored before the flag: TRL's default
    assert stored_run(path, race_args(trl_precision="float32"), 0, "Xeon") is None
    stored = json.loads(path.read_text())
    stored["settings"] |= {"trl_precision": "float32", "dtype": "float32"}
    path.write_text(json.dumps(stored))
    assert stored_run(path, race_args(trl_precision="float32"), 0, "Xeon") is not None
    assert stored_run(path, race_args(), 0, "Xeon") is None


CHILD = """
import signal, subprocess, sys, time
from pathlib import Path
folder = Path(sys.argv[1])
server = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
(folder / "server.pid").write_text(str(server.pid))
def stop(*_):
    server.terminate()
    server.wait()
    (folder / "stopped").write_text("its server stopped")
    sys.exit(143)
signal.signal(signal.SIGTERM, stop)
time.sleep(600)
"""

RACE = """
import sys
from atroposlib.local.signals import stop_signals_raise
from bench.trl_compare import run_to_end
with stop_signals_raise():
    run_to_end([sys.executable, "-c", sys.argv[1], sys.argv[2]])
"""


def test_a_stopped_race_stops_the_run_under_way_and_what_that_run_started(tmp_path: Path) -> None:
    root = Path(__file__).resolve().parents[2]
    race = subprocess.Popen([sys.executable, "-c", RACE, CHILD, str(tmp_path)], cwd=root,
                            env={**os.environ, "PYTHONPATH": str(root)})
    try:
        deadline = time.monotonic() + 60
        while not (tmp_path / "server.pid").is_file() and time.monotonic() < deadline:
            time.sleep(0.1)
        server = int((tmp_path / "server.pid").read_text())
        race.send_signal(signal.SIGTERM)
        race.wait(timeout=60)
        assert (tmp_path / "stopped").is_file(), "the run under way was killed before it could stop its server"
        with pytest.raises(ProcessLookupError):
            os.kill(server, 0)
    finally:
        race.kill()
        if (tmp_path / "server.pid").is_file() and not (tmp_path / "stopped").is_file():
            os.kill(int((tmp_path / "server.pid").read_text()), signal.SIGKILL)
