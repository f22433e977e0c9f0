"""`atropos-quickstart` with a stand-in runtime and environment: its summary
(CPU, dtype, tokens/s, where the logs are) and a SIGTERM that stops everything it started."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

from tests.local.stand_ins import (
    all_gone,
    killed_at_exit,
    model_folder,
    recorded_pids,
    running,
    signal_and_read,
    stand_in_environment,
    stand_in_runtime,
)


def _quickstart(tmp_path: Path, **environ: str) -> subprocess.Popen[str]:
    runtime = stand_in_runtime(tmp_path)
    out_dir = tmp_path / "out"
    (out_dir / "gsm8k_style").mkdir(parents=True)
    (out_dir / "gsm8k_style" / "train.jsonl").write_text("")
    env = {**os.environ, "ATROPOS_VLLM_RUNTIME": str(runtime.path), "ATROPOS_HOME": str(tmp_path / "home"),
           "STAND_IN_PIDS": str(tmp_path / "pids"), **environ}
    command = [sys.executable, "-m", "atroposlib.local.quickstart", "--model", str(model_folder(tmp_path / "model")),
               "--env-file", str(stand_in_environment(tmp_path)), "--out-dir", str(out_dir), "--groups", "3",
               "--group-size", "2", "--dtype", "float32"]
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)


def test_the_summary_names_cpu_dtype_tokens_per_second_and_logs(tmp_path: Path) -> None:
    quickstart = _quickstart(tmp_path)
    output, _ = quickstart.communicate(timeout=120)
    assert quickstart.returncode == 0, output
    assert "dtype: float32 (asked for with --dtype)" in output and "vLLM log: " in output
    assert "process-mode log: " in output
    # process mode's report is shown, its other output stays in its log
    assert "wrote 3 groups to" in output and "1 generated group was not written:" in output
    assert "config dump" not in output
    summary = output[output.index("Done."):]
    assert "3 groups, 6 rollouts, mean score +0.000, 50.0% correct" in summary
    assert re.search(r"\d of 3 groups carry a learning signal", summary), summary
    assert re.search(r"vLLM dtype float32: [\d,]+ tokens generated in \d+ s, [\d.]+ tokens/s", summary), summary
    logs = re.search(r"logs: +(\S+) \(process mode\), (\S+) \(vLLM\)", summary)
    assert logs and "config dump" in Path(logs[1]).read_text() and "stand-in vLLM" in Path(logs[2]).read_text()
    for pid in map(int, (tmp_path / "pids").read_text().split()):
        assert not running(pid)


def test_sigterm_stops_the_environment_and_vllm(tmp_path: Path) -> None:
    quickstart = _quickstart(tmp_path, STAND_IN_ENV_SLEEPS="1")
    with killed_at_exit(quickstart):
        started = recorded_pids(tmp_path / "pids", 3)  # vLLM, its engine, the environment
        output = signal_and_read(quickstart, signal.SIGTERM)
    assert quickstart.returncode == 1 and "stopped by SIGTERM: stopped vLLM and the environment" in output, output
    assert "==> stop vLLM" in output
    all_gone(started)
