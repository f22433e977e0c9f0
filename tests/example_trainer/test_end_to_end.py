"""The whole RL loop on a CPU, as a user runs it: `run-api`, an environment in ``serve`` mode
sampling from the trainer's vLLM (``server_type: vllm``), and `atropos-grpo` restarting vLLM
on a new checkpoint after every step (each server forked from the fork server). The
environment is the README's small sums, which the model gets right about half the time, so
groups have unequal scores and every step changes the weights; each group says which weights
sampled it, and the trainer logs its staleness."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Iterator, Optional

import httpx
import pytest

from atroposlib.local.allocator import find_library
from tests.doc_commands import readme_arguments
from tests.helpers import ApiProcess, free_port

ROOT = Path(__file__).resolve().parent.parent.parent
PROBE = "The capital of France is Paris. The capital of Italy is Rome."

pytestmark = [pytest.mark.slow, pytest.mark.real_vllm, pytest.mark.timeout(1500)]


class ServedLogprobs:
    """Asks vLLM for the prompt logprobs of a fixed text each time the trainer says vLLM serves new
    weights ("vLLM ready", "vLLM now serves"), holding the trainer (SIGSTOP) until vLLM has answered:
    a step takes seconds on a loaded CPU, so an unpaused probe could miss the weights of the last
    restart. Each answer is kept in order; new weights being served show up as a new answer."""

    MARKERS = re.compile(r"^(vLLM ready|step \d+: vLLM now serves)", re.MULTILINE)

    def __init__(self, port: int, token_ids: list[int], trainer_log: Path) -> None:
        self.url = f"http://127.0.0.1:{port}/generate"
        self.token_ids = token_ids
        self.trainer_log = trainer_log
        self.trainer: Optional[subprocess.Popen[bytes]] = None
        self.seen: list[tuple[float, ...]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _probe(self) -> Optional[tuple[float, ...]]:
        try:
            answer = httpx.post(self.url, timeout=30, json={
                "prompt": {"prompt_token_ids": self.token_ids}, "max_tokens": 1, "prompt_logprobs": 0}).json()
        except (httpx.HTTPError, ValueError):
            return None
        positions = answer.get("prompt_logprobs") or []
        return tuple(round(next(iter(entry.values())), 3) for entry in positions if entry) or None

    def _probe_holding_the_trainer(self, trainer: subprocess.Popen[bytes]) -> None:
        trainer.send_signal(signal.SIGSTOP)
        try:
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline and not self._stop.is_set():
                served = self._probe()
                if served:
                    self.seen.append(served)
                    return
                time.sleep(0.5)
        finally:
            trainer.send_signal(signal.SIGCONT)

    def _run(self) -> None:
        probed = 0
        while not self._stop.wait(0.2):
            trainer = self.trainer
            if trainer is None or trainer.poll() is not None or not self.trainer_log.exists():
                continue
            markers = len(self.MARKERS.findall(self.trainer_log.read_text(errors="replace")))
            for _ in range(probed, markers):
                self._probe_holding_the_trainer(trainer)
            probed = markers

    def __enter__(self) -> "ServedLogprobs":
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        self._thread.join(150)


def processes_mentioning(*needles: str) -> list[str]:
    """Command lines of live processes that contain every needle."""
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            text = cmdline.read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if all(needle in text for needle in needles):
            found.append(text)
    return found


def environment_command(api: ApiProcess, vllm_port: int, model_dir: Path, tmp_path: Path) -> list[str]:
    """The README's terminal 3 (block training-commands), on the test's ports and folders, with small sizes."""
    readme = readme_arguments("training-commands", "python environments/small_sums_env.py serve",
                              {"127.0.0.1:9001": f"127.0.0.1:{vllm_port}"}, MODEL=str(model_dir))
    return [sys.executable, str(ROOT / "environments" / "small_sums_env.py"), "serve", *readme,
            "--env.rollout_server_url", api.url, "--env.group_size", "4", "--env.max_answer_tokens", "16",
            "--env.max_num_workers", "2", "--env.spool_dir", str(tmp_path / "spool"), "--openai.api_key", "x"]


def trainer_command(api: ApiProcess, vllm_port: int, model_dir: Path, tmp_path: Path, *extra: str) -> list[str]:
    """The README's terminal 2 (block training-commands), then the test's sizes, ports and folders
    (the last value wins)."""
    return [sys.executable, "-u", "-m", "example_trainer.grpo",
            *readme_arguments("training-commands", "atropos-grpo", MODEL=str(model_dir)),
            "--training-steps", "2", "--batch-size", "4", "--gradient-accumulation-steps", "2",
            "--seq-len", "512", "--max-model-len", "1024", "--optimizer", "adamw", "--lr", "1e-4",
            "--vllm-port", str(vllm_port), "--atropos-url", api.url, "--save-path", str(tmp_path / "checkpoints"),
            "--log-dir", str(tmp_path / "logs"), *extra]


@pytest.fixture
def api(tmp_path: Path) -> Iterator[ApiProcess]:
    with ApiProcess(tmp_path / "state") as server:
        yield server


def stop(process: subprocess.Popen[bytes], timeout: float = 120) -> int:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
    return process.wait(timeout)


def stop_at_once(env: subprocess.Popen[bytes]) -> int:
    """An environment's second SIGTERM ends it without the grace its groups in flight get after the
    first (up to 30 s): once the trainer has stopped vLLM they cannot finish."""
    if env.poll() is None:
        env.send_signal(signal.SIGTERM)
        try:
            return env.wait(2)
        except subprocess.TimeoutExpired:
            env.send_signal(signal.SIGTERM)
    return env.wait(120)


def test_two_steps_of_grpo_restart_vllm_on_the_new_checkpoint(api: ApiProcess, real_model_dir: Path,
                                                              tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    vllm_port = free_port()
    probe_ids = AutoTokenizer.from_pretrained(real_model_dir).encode(PROBE)
    trainer_log, env_log = tmp_path / "trainer.log", tmp_path / "env.log"
    command = trainer_command(api, vllm_port, real_model_dir, tmp_path, "--weight-bridge-mode", "none",
                              "--vllm-restart-interval", "1")
    served = ServedLogprobs(vllm_port, probe_ids, trainer_log)
    with open(trainer_log, "wb") as tlog, open(env_log, "wb") as elog, served:
        trainer = served.trainer = subprocess.Popen(command, cwd=tmp_path, stdout=tlog, stderr=subprocess.STDOUT)
        env = subprocess.Popen(environment_command(api, vllm_port, real_model_dir, tmp_path),
                               cwd=tmp_path, stdout=elog, stderr=subprocess.STDOUT)
        try:
            returncode = trainer.wait(1200)
        finally:
            stop(trainer)
            stop_at_once(env)
    log = trainer_log.read_text(errors="replace")
    assert returncode == 0, log[-4000:] + env_log.read_text(errors="replace")[-2000:]
    checkpoints = tmp_path / "checkpoints"
    for name in ("step_1", "step_2", "final_model"):
        assert (checkpoints / name / "model.safetensors").exists(), name
        assert (checkpoints / name / "trainer_state.json").exists(), name
    status = httpx.get(api.url + "/status").json()
    assert status["current_step"] == 2
    assert status.get("leased_batches", 0) == 0  # prefetched, untrained batches went back
    assert len(served.seen) == 2, f"vLLM answered {len(served.seen)} of the 2 probes: {log[-3000:]}"
    assert served.seen[0] != served.seen[1], f"vLLM served the same logprobs after the restart: {log[-3000:]}"
    assert log.count("vLLM now serves") == 1  # after step 1; the last step ends the run
    assert re.search(r"step 2 \|.*\| staleness [0-9.]+ \(max [01]\)", log), log[-3000:]  # versions 0 or 1 at step 1
    assert not processes_mentioning("vllm_api_server", str(vllm_port))
    vllm_log = (tmp_path / "logs" / "vllm.log").read_text(errors="replace")
    # both servers forked from one fork server: the restart skipped vLLM's import
    assert vllm_log.count("atropos fork server: imported") == 1 and vllm_log.count("forked server pid") == 2
    if find_library():  # the command line restarted the trainer with it, and its vLLM inherited it
        assert "memory allocator: tcmalloc" in log, log[:2000]
        assert "libtcmalloc is not found" not in (tmp_path / "logs" / "vllm.log").read_text(errors="replace")
