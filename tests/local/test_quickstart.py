"""`atropos-quickstart` with a stand-in runtime and environment: its summary
(CPU, dtype, tokens/s, where the logs are, groups with a learning signal), the command line of
each task's environment, and a SIGTERM that stops everything it started."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from argparse import Namespace
from pathlib import Path

import pytest

from atroposlib.local import quickstart as quickstart_module
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


def _quickstart(tmp_path: Path, *flags: str, **environ: str) -> subprocess.Popen[str]:
    runtime = stand_in_runtime(tmp_path)
    out_dir = tmp_path / "out"
    (out_dir / "gsm8k_style").mkdir(parents=True)
    (out_dir / "gsm8k_style" / "train.jsonl").write_text("")
    env = {**os.environ, "ATROPOS_VLLM_RUNTIME": str(runtime.path), "ATROPOS_HOME": str(tmp_path / "home"),
           "STAND_IN_PIDS": str(tmp_path / "pids"), **environ}
    command = [sys.executable, "-m", "atroposlib.local.quickstart", "--model", str(model_folder(tmp_path / "model")),
               "--env-file", str(stand_in_environment(tmp_path)), "--out-dir", str(out_dir), "--groups", "3",
               "--group-size", "2", "--dtype", "float32", *flags]
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
    assert "==> generate GSM8K-style problems" not in output  # the default task, small sums, needs none
    assert "rollouts: " + str(tmp_path / "out" / "small_sums-") in output
    summary = output[output.index("Done."):]
    assert "3 groups, 6 rollouts, mean score +0.000, 50.0% correct" in summary
    assert re.search(r"\d of 3 groups carry a learning signal", summary), summary
    assert re.search(r"vLLM dtype float32: [\d,]+ tokens generated in \d+ s, [\d.]+ tokens/s", summary), summary
    logs = re.search(r"logs: +(\S+) \(process mode\), (\S+) \(vLLM\)", summary)
    assert logs and "config dump" in Path(logs[1]).read_text() and "stand-in vLLM" in Path(logs[2]).read_text()
    for pid in map(int, (tmp_path / "pids").read_text().split()):
        assert not running(pid)


def test_the_gsm8k_task_runs_its_problem_stage_and_names_its_files(tmp_path: Path) -> None:
    quickstart = _quickstart(tmp_path, "--task", "gsm8k")
    output, _ = quickstart.communicate(timeout=120)
    assert quickstart.returncode == 0, output
    assert "==> generate GSM8K-style problems" in output  # the problems exist already: nothing is generated
    assert "rollouts: " + str(tmp_path / "out" / "gsm8k-") in output and "3 groups, 6 rollouts" in output


class _Server:
    """What `environment_command` asks of a LocalVLLM: the flags that point an env at it."""

    def openai_flags(self) -> list[str]:
        return ["--openai.server_type", "vllm"]


@pytest.mark.parametrize("task, budget_flag, only_there, not_there", [
    ("small_sums", "--env.max_answer_tokens", "--env.ensure_scores_are_not_same", "--env.train_file"),
    ("gsm8k", "--env.max_token_length", "--env.train_file", "--env.ensure_scores_are_not_same"),
])
def test_each_task_gets_the_flags_of_its_environment(task: str, budget_flag: str, only_there: str,
                                                     not_there: str, tmp_path: Path) -> None:
    args: Namespace = quickstart_module.parse_args(["--task", task, "--max-tokens", "7"])
    command = quickstart_module.environment_command(_Server(), args, tmp_path / "data", tmp_path / "out.jsonl")
    flags = dict(zip(command[3::2], command[4::2]))
    assert command[1:3] == [str(args.env_file), "process"]
    assert flags[budget_flag] == "7" and only_there in flags and not_there not in flags
    assert flags["--openai.server_type"] == "vllm"  # small sums' managed_server() needs vLLM's token ids
    if task == "small_sums":  # every group is written, so the summary counts the ones without a signal
        assert flags["--env.ensure_scores_are_not_same"] == "false"


def test_sigterm_stops_the_environment_and_vllm(tmp_path: Path) -> None:
    quickstart = _quickstart(tmp_path, STAND_IN_ENV_SLEEPS="1")
    with killed_at_exit(quickstart):
        started = recorded_pids(tmp_path / "pids", 3)  # vLLM, its engine, the environment
        output = signal_and_read(quickstart, signal.SIGTERM)
    assert quickstart.returncode == 1 and "stopped by SIGTERM: stopped vLLM and the environment" in output, output
    assert "==> stop vLLM" in output
    all_gone(started)
