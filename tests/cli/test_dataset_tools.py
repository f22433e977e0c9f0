"""atropos-sft-gen and atropos-dpo-gen as people run them: against a live `run-api`, from a
`process` JSONL file, and beside a training run they must not disturb."""

from __future__ import annotations

import json
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from transformers import AutoTokenizer

from atroposlib.cli import dpo, sft
from tests.cli.dataset_cases import make_groups
from tests.conftest import registration
from tests.envs.conftest import env_command, start_fake_inference
from tests.helpers import ApiProcess, free_port
from tests.reference_tests import REFERENCE_PYTHON

pytestmark = pytest.mark.slow
BIN = Path(sys.executable).parent
TOOL_S = 120  # importing transformers on a busy 2-core machine


def push(api_url: str, groups: list[dict[str, Any]]) -> None:
    """Register an environment (once the consumer has started) and queue `groups`."""
    size = len(groups[0]["scores"])
    body = {"max_token_length": 1024, "desired_name": "cases", "weight": 1.0, "group_size": size}
    deadline = time.monotonic() + TOOL_S
    while "env_id" not in (answer := httpx.post(api_url + "/register-env", json=body).json()):
        assert time.monotonic() < deadline, f"the tool never started taking batches: {answer}"
        time.sleep(0.2)
    for group in groups:
        httpx.post(api_url + "/scored_data", json={**group, "env_id": answer["env_id"]}).raise_for_status()


def collect(command: list[str], api: ApiProcess, groups: list[dict[str, Any]], cwd: Path) -> subprocess.CompletedProcess:
    """Run a tool against `api`, feeding it `groups` once it has registered."""
    tool = subprocess.Popen(command, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        push(api.url, groups)
        out, err = tool.communicate(timeout=TOOL_S)
    finally:
        if tool.poll() is None:
            tool.kill()
            tool.wait()
    return subprocess.CompletedProcess(command, tool.returncode, out, err)


def reference_command(tool: str, args: list[str], seed: int) -> list[str]:
    code = (f"import random, sys; from atroposlib.cli import {tool}; random.seed({seed}); "
            f"sys.argv = ['atropos-{tool}-gen', *{args!r}]; {tool}.main()")
    return [str(REFERENCE_PYTHON), "-c", code]


def expected_rows(tool: str, tokenizer: Any, groups: list[dict[str, Any]], seed: int, **flags: Any) -> int:
    rng = random.Random(seed)
    if tool == "sft":
        return sum(len(sft.grab_group_data(tokenizer, g, False, 3, **flags)) for g in groups)
    return sum(len(dpo.grab_group_data(tokenizer, g, False, 3, rng=rng, **flags)) for g in groups)


@pytest.mark.skipif(not REFERENCE_PYTHON.exists(), reason="the reference venv (bench/setup_reference.sh) is missing")
@pytest.mark.parametrize("tool", ["sft", "dpo"])
def test_files_equal_atropos_tools_on_the_same_batches(tool: str, tokenizer_dir: Path, tmp_path: Path) -> None:
    tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    groups = make_groups(tokenizer, count=16, seed=8, size=4)  # whole batches for both tools' batch sizes
    flags = {"allow_negative_scores": True, "minimum_score_diff_max_min": 0.25}
    wanted = expected_rows(tool, tokenizer, groups, seed=21, **flags)
    common = ["--group-size", "4", "--tokenizer", str(tokenizer_dir), "--num-seqs-to-save", str(wanted),
              "--allow-negative-scores", "--minimum-score-diff-max-min", "0.25"]
    common += ["--tasks-per-step", "2"] if tool == "sft" else []
    outputs = {}
    for who in ("reference", "ours"):
        output = tmp_path / f"{who}.jsonl"
        with ApiProcess(None) as api:
            args = [str(output), "--api-url", api.url, *common]
            command = (reference_command(tool, args, seed=21) if who == "reference"
                       else [str(BIN / f"atropos-{tool}-gen"), *args, *(["--seed", "21"] if tool == "dpo" else [])])
            done = collect(command, api, groups, tmp_path)
        assert done.returncode == 0, done.stderr[-2000:]
        outputs[who] = output.read_bytes()
    assert outputs["ours"] == outputs["reference"]
    assert len(outputs["ours"].splitlines()) == wanted > 0


def test_dataset_from_a_serving_environment_and_from_its_process_file(tokenizer_dir: Path, tmp_path: Path) -> None:
    inference, inference_url = start_fake_inference()
    env_flags = ["--env.tokenizer_name", str(tokenizer_dir), "--openai.base_url", inference_url,
                 "--openai.model_name", "fake-model", "--env.use_wandb", "false", "--env.group_size", "4"]
    try:
        with ApiProcess(None) as api:
            output = tmp_path / "sft.jsonl"
            tool = subprocess.Popen([str(BIN / "atropos-sft-gen"), str(output), "--api-url", api.url, "--group-size", "4",
                                     "--tasks-per-step", "2", "--tokenizer", str(tokenizer_dir), "--num-seqs-to-save", "4"],
                                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            env = subprocess.Popen(env_command("serve", *env_flags, "--env.rollout_server_url", api.url,
                                               "--env.spool_dir", str(tmp_path / "spool"), "--env.total_steps", "1000"),
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            try:
                log, _ = tool.communicate(timeout=TOOL_S * 2)
            finally:
                for process in (tool, env):
                    stop(process)
            assert tool.returncode == 0, log[-2000:]
            rows = [json.loads(line) for line in output.read_text().splitlines()]
            assert len(rows) >= 4 and all(row["score"] > 0 and "+" in row["prefix"] for row in rows)
            provenance = json.loads((tmp_path / "sft.jsonl.provenance.json").read_text())["runs"][-1]
            assert provenance["counts"]["rows"] == len(rows) and provenance["source"]["api_url"] == api.url
            assert httpx.get(api.url + "/status").json()["leased_batches"] == 0
        groups_file = tmp_path / "groups.jsonl"
        subprocess.run(env_command("process", *env_flags, "--env.data_path_to_save_groups", str(groups_file),
                                   "--env.total_steps", "3"), check=True, capture_output=True, timeout=TOOL_S * 2)
    finally:
        inference.terminate()
        inference.wait(10)
    pairs = tmp_path / "dpo.jsonl"
    done = subprocess.run([str(BIN / "atropos-dpo-gen"), str(pairs), "--from-jsonl", str(groups_file), "--save-messages",
                           "--num-seqs-to-save", "100", "--seed", "1"], capture_output=True, text=True, timeout=TOOL_S)
    assert done.returncode == 0, done.stderr
    for pair in map(json.loads, pairs.read_text().splitlines()):
        assert pair["pos"] != pair["neg"] and pair["pos"][-1]["role"] == "assistant"


def stop(process: subprocess.Popen) -> None:
    """Ctrl-C, then a second one (serve stops at once on it), then SIGKILL: never left running."""
    for signum, grace in ((signal.SIGINT, 90), (signal.SIGINT, 30), (signal.SIGKILL, 30)):
        if process.poll() is not None:
            return
        process.send_signal(signum)
        try:
            process.wait(grace)
        except subprocess.TimeoutExpired:
            continue


def run_tool(capsys: pytest.CaptureFixture[str], *args: str) -> subprocess.CompletedProcess:
    """`atropos-sft-gen ARGS` in this process (the console script's `main`)."""
    capsys.readouterr()
    with pytest.raises(SystemExit) as ended:
        sft.main(list(args))
    captured = capsys.readouterr()
    return subprocess.CompletedProcess(args, ended.value.code, captured.out, captured.err)


def test_refuses_to_take_a_registered_trainers_batches(tokenizer_dir: Path, tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    with ApiProcess(None) as api:
        httpx.post(api.url + "/register", json=registration(8)).raise_for_status()
        httpx.get(api.url + "/batch")
        push(api.url, make_groups(AutoTokenizer.from_pretrained(str(tokenizer_dir)), count=4, seed=1, size=4))
        before = httpx.get(api.url + "/status").json()
        output = tmp_path / "rows.jsonl"
        done = run_tool(capsys, str(output), "--api-url", api.url, "--tokenizer", str(tokenizer_dir), "--reset")
        assert done.returncode == 2
        assert "a training run is registered" in done.stderr and "--force" in done.stderr
        assert "Traceback" not in done.stderr and not output.exists()
        assert httpx.get(api.url + "/status").json() == before  # nothing reset, nothing taken
        forced = run_tool(capsys, str(output), "--api-url", api.url, "--tokenizer", str(tokenizer_dir), "--force",
                          "--num-seqs-to-save", "1", "--allow-negative-scores")
        assert forced.returncode == 0, forced.stderr
        after = httpx.get(api.url + "/status").json()
        assert after["current_step"] == 0  # the trainer's step: a tool's batches are not trained on
        assert after["queue_size"] < before["queue_size"] and after.get("dropped_groups", {}) == {}


def test_takes_what_a_finished_training_run_left_without_force(tokenizer_dir: Path, tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    with ApiProcess(None) as api:
        httpx.post(api.url + "/register", json=registration(8, num_steps=1, max_staleness=0)).raise_for_status()
        httpx.get(api.url + "/batch")
        push(api.url, make_groups(AutoTokenizer.from_pretrained(str(tokenizer_dir)), count=6, seed=1, size=4))
        lease = httpx.post(api.url + "/batch").json()  # the trainer's one and last step
        httpx.post(f"{api.url}/batch/{lease['batch_id']}/ack").raise_for_status()
        output = tmp_path / "rows.jsonl"
        done = run_tool(capsys, str(output), "--api-url", api.url, "--tokenizer", str(tokenizer_dir),
                        "--num-seqs-to-save", "4", "--allow-negative-scores")
        assert done.returncode == 0, done.stderr
        assert "has finished: taking the groups it left" in done.stdout + done.stderr
        status = httpx.get(api.url + "/status").json()
        assert status["current_step"] == 1 and status.get("dropped_groups", {}) == {}
        assert output.read_text().splitlines()  # rows written from the groups the run left


def test_a_second_run_after_an_api_restart_needs_no_force(tokenizer_dir: Path, tmp_path: Path) -> None:
    groups = make_groups(AutoTokenizer.from_pretrained(str(tokenizer_dir)), count=4, seed=1, size=4)
    outputs = []
    for attempt in ("first", "second"):
        with ApiProcess(tmp_path / "state") as api:  # the second API restores the first one's registration
            command = [str(BIN / "atropos-sft-gen"), str(tmp_path / f"{attempt}.jsonl"), "--api-url", api.url,
                       "--tokenizer", str(tokenizer_dir), "--num-seqs-to-save", "1", "--allow-negative-scores",
                       "--group-size", "4", "--tasks-per-step", "1"]
            done = collect(command, api, groups[:2], tmp_path)
            assert done.returncode == 0, done.stderr
            outputs.append(done.stdout + done.stderr)
    assert "registered by a dataset tool with these settings" in outputs[1]


def test_output_is_checked_before_the_api_is_touched(tokenizer_dir: Path, tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    output = tmp_path / "rows.jsonl"
    output.write_text("keep me\n")
    unused = f"http://127.0.0.1:{free_port()}"
    done = run_tool(capsys, str(output), "--api-url", unused, "--tokenizer", str(tokenizer_dir))
    assert done.returncode == 2 and "already exists" in done.stderr and "--append-to-previous" in done.stderr
    assert output.read_text() == "keep me\n"
    unreachable = run_tool(capsys, str(tmp_path / "new.jsonl"), "--api-url", unused, "--tokenizer", str(tokenizer_dir))
    assert unreachable.returncode == 2 and "cannot reach the trajectory API" in unreachable.stderr
    assert "Traceback" not in unreachable.stderr and not (tmp_path / "new.jsonl").exists()
    bad_line = tmp_path / "bad.jsonl"
    bad_line.write_text('{"scores": [1], "messages": [[{"role": "user", "content": "hi"}]]}\nnot json\n')
    broken = run_tool(capsys, str(tmp_path / "x.jsonl"), "--from-jsonl", str(bad_line), "--save-messages")
    assert broken.returncode == 2 and "bad.jsonl:2 is not JSON" in broken.stderr


def test_a_stop_signal_flushes_the_file_and_gives_back_leases(tokenizer_dir: Path, tmp_path: Path) -> None:
    signum = signal.SIGTERM  # Ctrl-C takes the same path (atroposlib.local.signals)
    with ApiProcess(None) as api:
        output = tmp_path / "rows.jsonl"
        tool = subprocess.Popen([str(BIN / "atropos-sft-gen"), str(output), "--api-url", api.url, "--tokenizer",
                                 str(tokenizer_dir), "--group-size", "4", "--tasks-per-step", "2"],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            push(api.url, make_groups(AutoTokenizer.from_pretrained(str(tokenizer_dir)), count=2, seed=2, size=4))
            deadline = time.monotonic() + TOOL_S
            while not httpx.get(api.url + "/batches/served?since=0").json()["batches"]:  # one batch written
                assert time.monotonic() < deadline
                time.sleep(0.2)
            tool.send_signal(signum)
            _, err = tool.communicate(timeout=30)
        finally:
            if tool.poll() is None:
                tool.kill()
        assert tool.returncode == 128 + signum, err
        assert "stopped by" in err and "Traceback" not in err
        written = output.read_text().splitlines()
        assert all(json.loads(line) for line in written)  # whole lines only
        status = httpx.get(api.url + "/status").json()
        assert status["leased_batches"] == 0


@pytest.mark.parametrize("tool", [sft, dpo])
def test_a_run_that_writes_no_rows_says_which_filter_left_everything_out(tool: Any, tokenizer_dir: Path,
                                                                         tmp_path: Path,
                                                                         capsys: pytest.CaptureFixture[str]) -> None:
    tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    groups = make_groups(tokenizer, 3, seed=1, size=4)
    for group in groups:
        group["scores"] = [-1.0, -1.0, -0.5, -1.0]  # `atropos-quickstart --task gsm8k`'s: every answer wrong
    source = tmp_path / "groups.jsonl"
    source.write_text("".join(json.dumps(group) + "\n" for group in groups))
    with pytest.raises(SystemExit) as ended:
        tool.main([str(tmp_path / "out.jsonl"), "--from-jsonl", str(source), "--tokenizer", str(tokenizer_dir)])
    assert ended.value.code == 0
    err = capsys.readouterr().err
    assert "no rows: every rollout scored 0 or less (best -0.5)" in err and "--allow-negative-scores" in err
