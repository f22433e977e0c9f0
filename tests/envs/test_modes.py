"""An Atropos-style environment file runs unchanged in process, serve and evaluate modes."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from tests.conftest import registration
from tests.envs.conftest import env_command, start_fake_inference
from tests.helpers import ApiProcess

pytestmark = pytest.mark.slow


def common_flags(tokenizer_dir: Path, inference_url: str, tmp_path: Path) -> list[str]:
    return ["--env.tokenizer_name", str(tokenizer_dir), "--openai.base_url", inference_url,
            "--openai.model_name", "fake-model", "--env.use_wandb", "false", "--env.spool_dir", str(tmp_path / "spool")]


def test_process_writes_jsonl_and_html(tokenizer_dir: Path, inference_url: str, tmp_path: Path) -> None:
    out = tmp_path / "out" / "groups.jsonl"
    flags = common_flags(tokenizer_dir, inference_url, tmp_path) + [
        "--env.total_steps", "6", "--env.data_path_to_save_groups", str(out)]
    result = subprocess.run(env_command("process", *flags), cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    groups = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(groups) == 6
    for group in groups:
        assert len(group["tokens"]) == 4 and sorted(set(group["scores"])) == [-1.0, 1.0]
        for tokens, masks in zip(group["tokens"], group["masks"]):
            first = next(i for i, m in enumerate(masks) if m != -100)
            assert masks[:first] == [-100] * first and masks[first:] == tokens[first:]
        assert group["messages"][0][-1]["role"] == "assistant"
    assert "Group 5" in out.with_suffix(".html").read_text()
    again = subprocess.run(env_command("process", *flags), cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert again.returncode == 0 and (out.parent / "groups_1.jsonl").exists()


def test_process_fails_clearly_without_an_inference_server(tokenizer_dir: Path, tmp_path: Path) -> None:
    flags = common_flags(tokenizer_dir, "http://127.0.0.1:9/v1", tmp_path) + [
        "--env.total_steps", "2", "--env.process_max_consecutive_failures", "2",
        "--env.data_path_to_save_groups", str(tmp_path / "g.jsonl")]
    result = subprocess.run(env_command("process", *flags), cwd=tmp_path, capture_output=True, text=True, timeout=180)
    assert result.returncode == 1 and "no inference server answers at http://127.0.0.1:9/v1" in result.stderr
    assert not list(tmp_path.glob("g*.jsonl")) and not list(tmp_path.glob("g*.html"))  # no empty file left


def test_a_base_url_without_v1_still_reaches_the_openai_routes(tokenizer_dir: Path, inference_url: str,
                                                                tmp_path: Path) -> None:
    root = inference_url.removesuffix("/v1")
    flags = common_flags(tokenizer_dir, root, tmp_path) + [
        "--env.total_steps", "2", "--env.data_path_to_save_groups", str(tmp_path / "g.jsonl")]
    result = subprocess.run(env_command("process", *flags), cwd=tmp_path, capture_output=True, text=True, timeout=180)
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"base_url {root} has no path: using {root}/v1" in result.stderr and "Traceback" not in result.stderr
    assert len((tmp_path / "g.jsonl").read_text().splitlines()) == 2


def test_unknown_flag_exits_2(tmp_path: Path) -> None:
    result = subprocess.run(env_command("process", "--env.total_step", "3"), cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and "did you mean --env.total_steps" in result.stderr


def test_evaluate_writes_metrics_and_samples(tokenizer_dir: Path, inference_url: str, tmp_path: Path) -> None:
    evals = tmp_path / "evals"
    flags = common_flags(tokenizer_dir, inference_url, tmp_path) + ["--env.data_dir_to_save_evals", str(evals)]
    result = subprocess.run(env_command("evaluate", *flags), cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    metrics = json.loads((evals / "metrics.json").read_text())
    assert set(metrics["results"]) == {"atropos|arithmetic_eval|0", "all"}
    assert metrics["config_general"]["model_name"] == "fake-model"
    assert len((evals / "samples.jsonl").read_text().splitlines()) == 8
    assert (evals / "evaluate_config.yaml").read_text().startswith("env:")


def _start_serving(api_url: str, tokenizer_dir: Path, inference_url: str, tmp_path: Path, jsonl: Path) -> subprocess.Popen:
    flags = common_flags(tokenizer_dir, inference_url, tmp_path) + [
        "--env.rollout_server_url", api_url, "--env.total_steps", "1000", "--env.max_num_workers", "2",
        "--env.data_path_to_save_groups", str(jsonl), "--env.worker_timeout", "30"]
    return subprocess.Popen(env_command("serve", *flags), cwd=tmp_path, stdout=open(tmp_path / "env.log", "ab"),
                            stderr=subprocess.STDOUT)


def _drain(api_url: str) -> list[dict]:
    groups = []
    while True:
        batch = httpx.get(api_url + "/batch", timeout=30).json()["batch"]
        if not batch:
            return groups
        groups += batch


def test_serve_feeds_the_trainer_and_disconnects(tokenizer_dir: Path, inference_url: str, tmp_path: Path) -> None:
    with ApiProcess(tmp_path / "state") as api:
        httpx.post(api.url + "/register", json=registration(8)).raise_for_status()
        httpx.get(api.url + "/batch")
        env = _start_serving(api.url, tokenizer_dir, inference_url, tmp_path, tmp_path / "sent.jsonl")
        try:
            served: list[dict] = []
            deadline = time.monotonic() + 90
            while len(served) < 4 and time.monotonic() < deadline:
                batch = httpx.get(api.url + "/batch").json()["batch"]
                served += batch or []
                time.sleep(0.2)
            assert len(served) >= 4, (tmp_path / "env.log").read_text()[-3000:]
            assert all(g["env_id"] == 0 and len(g["tokens"]) == 4 for g in served)
        finally:
            env.send_signal(signal.SIGTERM)
            assert env.wait(60) == 0, (tmp_path / "env.log").read_text()[-3000:]
        assert httpx.get(api.url + "/envs").json()["envs"][0]["connected"] is False


def _serving_until_groups_are_queued(state: Path, tokenizer_dir: Path, inference_url: str, tmp_path: Path,
                                     sent: Path) -> tuple[ApiProcess, subprocess.Popen]:
    """A durable run-api with a trainer registered and `serve` feeding it, once 2 groups are queued."""
    api = ApiProcess(state).start()
    httpx.post(api.url + "/register", json=registration(8)).raise_for_status()
    httpx.get(api.url + "/batch")
    env = _start_serving(api.url, tokenizer_dir, inference_url, tmp_path, sent)
    deadline = time.monotonic() + 60
    while httpx.get(api.url + "/status").json()["queue_size"] < 2 and time.monotonic() < deadline:
        time.sleep(0.2)
    return api, env


def test_no_group_is_lost_when_the_api_dies(tokenizer_dir: Path, inference_url: str, tmp_path: Path) -> None:
    state, sent = tmp_path / "state", tmp_path / "sent.jsonl"
    api, env = _serving_until_groups_are_queued(state, tokenizer_dir, inference_url, tmp_path, sent)
    try:
        api.kill9()
        time.sleep(3)  # the env keeps producing and spools what it cannot send
        api = ApiProcess(state, port=api.port).start()
        time.sleep(3)
    finally:
        env.send_signal(signal.SIGTERM)
        code = env.wait(90)
    try:
        assert code == 0, (tmp_path / "env.log").read_text()[-3000:]
        produced = [json.loads(line) for line in sent.read_text().splitlines()]
        received = _drain(api.url) + [g for g in _queued_leftovers(api.url)]
        assert len(produced) >= 2
        assert sorted(json.dumps(g["scores"]) + str(g["tokens"][0][-5:]) for g in received) == sorted(
            json.dumps(g["scores"]) + str(g["tokens"][0][-5:]) for g in produced)
    finally:
        api.stop()


def test_an_env_waits_for_a_trainer_when_the_api_comes_back_fresh(tokenizer_dir: Path, inference_url: str,
                                                                 tmp_path: Path) -> None:
    state, sent = tmp_path / "state", tmp_path / "sent.jsonl"
    api, env = _serving_until_groups_are_queued(state, tokenizer_dir, inference_url, tmp_path, sent)
    try:
        api.kill9()
        api = ApiProcess(state, "--fresh", port=api.port).start()  # no run, no trainer
        time.sleep(4)
        assert env.poll() is None, (tmp_path / "env.log").read_text()[-3000:]  # it waits, it does not die
        httpx.post(api.url + "/register", json=registration(8)).raise_for_status()
        httpx.get(api.url + "/batch")
        deadline = time.monotonic() + 60
        while not httpx.get(api.url + "/envs").json()["envs"] and time.monotonic() < deadline:
            time.sleep(0.2)
        time.sleep(2)
    finally:
        env.send_signal(signal.SIGTERM)
        code = env.wait(90)
    try:
        log = (tmp_path / "env.log").read_text()
        assert code == 0 and "holds no run any more" in log and "Traceback" not in log, log[-3000:]
        assert httpx.get(api.url + "/envs").json()["envs"], log[-3000:]  # registered again
        assert not (tmp_path / "spool" / "rejected.jsonl").exists()
    finally:
        api.stop()


def _queued_leftovers(api_url: str) -> list[dict]:
    """Groups still queued that cannot fill a batch: served by a throwaway lease of size 4."""
    leftovers = []
    status = httpx.get(api_url + "/status").json()
    if status["queue_size"]:
        httpx.post(api_url + "/register?replace=true", json=registration(4)).raise_for_status()
        leftovers = _drain(api_url)
    return leftovers


def test_serve_testing_mode_needs_no_model(tokenizer_dir: Path, tmp_path: Path) -> None:
    with ApiProcess(tmp_path / "state") as api:
        httpx.post(api.url + "/register", json=registration(4)).raise_for_status()
        httpx.get(api.url + "/batch")
        flags = ["--testing", "--env.tokenizer_name", str(tokenizer_dir), "--env.use_wandb", "false",
                 "--env.rollout_server_url", api.url, "--env.ensure_scores_are_not_same", "false",
                 "--env.spool_dir", str(tmp_path / "spool")]
        env = subprocess.Popen(env_command("serve", *flags), cwd=tmp_path, stdout=open(tmp_path / "env.log", "ab"),
                               stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + 60
            batch = None
            while not batch and time.monotonic() < deadline:
                batch = httpx.get(api.url + "/batch").json()["batch"]
                time.sleep(0.2)
            assert batch, (tmp_path / "env.log").read_text()[-3000:]
            assert "testing harness" in batch[0]["messages"][0][-1]["content"]
        finally:
            env.send_signal(signal.SIGTERM)
            assert env.wait(60) == 0


def test_mistyped_mode_exits_2_with_a_suggestion(tmp_path: Path) -> None:
    result = subprocess.run(env_command("proces"), cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and "did you mean process?" in result.stderr


def test_evaluate_reports_its_wall_time(tokenizer_dir: Path, tmp_path: Path) -> None:
    slow, url = start_fake_inference(latency=0.25)  # evaluate() makes 8 requests one after another
    try:
        flags = common_flags(tokenizer_dir, url, tmp_path) + ["--env.data_dir_to_save_evals", str(tmp_path / "evals")]
        result = subprocess.run(env_command("evaluate", *flags), cwd=tmp_path, capture_output=True, text=True,
                                timeout=120)
    finally:
        slow.terminate()
        slow.wait(10)
    assert result.returncode == 0, result.stderr[-3000:]
    metrics = json.loads((tmp_path / "evals" / "metrics.json").read_text())
    assert float(metrics["config_general"]["total_evaluation_time_seconds"]) >= 8 * 0.25


def test_serve_logs_progress_and_a_summary_when_it_reaches_total_steps(tokenizer_dir: Path, tmp_path: Path) -> None:
    inference, inference_url = start_fake_inference(latency=1.0)  # slow enough for progress lines to be due
    with ApiProcess(None, "--ephemeral") as api:
        httpx.post(api.url + "/register", json=registration(8)).raise_for_status()
        httpx.get(api.url + "/batch")
        flags = common_flags(tokenizer_dir, inference_url, tmp_path) + [
            "--env.rollout_server_url", api.url, "--env.total_steps", "3", "--env.progress_log_interval", "0.5",
            "--env.max_num_workers", "2"]
        env = subprocess.Popen(env_command("serve", *flags), cwd=tmp_path, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True)
        try:
            deadline = time.monotonic() + 120
            while env.poll() is None and time.monotonic() < deadline:
                httpx.get(api.url + "/batch")  # the trainer takes batches, so the step advances
                time.sleep(0.3)
        finally:
            if env.poll() is None:
                env.kill()
            output = env.communicate(timeout=30)[0]
            inference.terminate()
            inference.wait(10)
    assert env.returncode == 0, output[-3000:]
    assert "HTTP Request:" not in output
    assert re.search(r"step \d+/3: \d+ groups sent \(\d+ rollouts\), 0 dropped", output), output[-3000:]
    summary = re.search(r"serve stopped \(total_steps 3 reached, counting the groups queued at the API\) "
                        r"after \S+: step \d/3, (\d+) groups sent \((\d+) rollouts\)", output)
    assert summary and int(summary.group(1)) >= 3 and int(summary.group(2)) == 4 * int(summary.group(1)), output[-3000:]


def test_serve_refuses_groups_larger_than_the_batch_in_one_line(tokenizer_dir: Path, tmp_path: Path) -> None:
    with ApiProcess(None, "--ephemeral") as api:
        httpx.post(api.url + "/register", json=registration(8)).raise_for_status()
        httpx.get(api.url + "/batch")
        flags = common_flags(tokenizer_dir, "http://127.0.0.1:9/v1", tmp_path) + [
            "--env.rollout_server_url", api.url, "--env.group_size", "16"]
        result = subprocess.run(env_command("serve", *flags), cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr[-3000:]
    assert "--env.group_size 16 exceeds the trainer's batch size 8" in result.stderr
    assert "serve stopped (failed: ServeSetupError" in result.stderr


def test_serve_says_why_it_drops_equal_score_groups(tokenizer_dir: Path, inference_url: str, tmp_path: Path) -> None:
    with ApiProcess(None, "--ephemeral") as api:
        httpx.post(api.url + "/register", json=registration(8)).raise_for_status()
        httpx.get(api.url + "/batch")
        flags = common_flags(tokenizer_dir, inference_url, tmp_path) + [
            "--env.rollout_server_url", api.url, "--env.group_size", "1", "--env.progress_log_interval", "0.5"]
        log_path = tmp_path / "env.log"
        env = subprocess.Popen(env_command("serve", *flags), cwd=tmp_path, stdout=open(log_path, "ab"),
                               stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + 120
            while "dropped (same_scores" not in log_path.read_text() and time.monotonic() < deadline:
                assert env.poll() is None, log_path.read_text()[-3000:]
                time.sleep(0.3)
        finally:
            env.send_signal(signal.SIGTERM)
            assert env.wait(60) == 0, log_path.read_text()[-3000:]
    log = log_path.read_text()
    warnings = [line for line in log.splitlines() if "dropping groups: same_scores" in line]
    assert len(warnings) == 1 and "--env.ensure_scores_are_not_same false" in warnings[0]
    summary = next(line for line in log.splitlines() if "serve stopped (SIGTERM received)" in line)
    assert re.search(r"0 groups sent \(0 rollouts\), (\d+) dropped \(same_scores \1\)", summary), summary
    assert summary.endswith("--env.ensure_scores_are_not_same false keeps groups whose scores are all equal")



GSM8K = Path(__file__).resolve().parents[2] / "environments" / "gsm8k_server.py"


def test_managed_server_on_an_openai_backend_stops_process_and_serve_with_the_hint(
    tokenizer_dir: Path, inference_url: str, tmp_path: Path
) -> None:
    import sys

    rows = tmp_path / "train.jsonl"
    rows.write_text("".join(json.dumps({"question": f"What is {a} + {a}?", "answer": f"#### {2 * a}"}) + "\n"
                            for a in range(1, 6)))
    flags = common_flags(tokenizer_dir, inference_url, tmp_path) + [
        "--env.total_steps", "4", "--env.group_size", "2", "--env.train_file", str(rows), "--env.test_file", str(rows)]
    processed = subprocess.run([sys.executable, str(GSM8K), "process", *flags, "--env.data_path_to_save_groups",
                                str(tmp_path / "g.jsonl")], cwd=tmp_path, capture_output=True, text=True, timeout=180)
    assert processed.returncode == 2, processed.stderr[-3000:]
    assert "--openai.server_type vllm" in processed.stderr and "Traceback" not in processed.stderr
    with ApiProcess(tmp_path / "state") as api:
        httpx.post(api.url + "/register", json=registration(8)).raise_for_status()
        httpx.get(api.url + "/batch")
        served = subprocess.run([sys.executable, str(GSM8K), "serve", *flags, "--env.rollout_server_url", api.url],
                                cwd=tmp_path, capture_output=True, text=True, timeout=180)
    assert served.returncode == 2, served.stderr[-3000:]
    assert "--openai.server_type vllm" in served.stderr
