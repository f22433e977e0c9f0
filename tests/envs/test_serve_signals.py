"""Ctrl-C and SIGTERM stop `serve` promptly in every phase, with a clean exit.

Real processes as a user runs them: ``python environments/arithmetic_env.py serve``
against ``run-api`` on a free loopback port (and a fake inference server).
"""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Callable, Iterator, Optional

import httpx
import pytest

from tests.conftest import registration
from tests.envs.conftest import ROOT, env_command, start_fake_inference
from tests.helpers import ApiProcess

pytestmark = pytest.mark.slow

STARTUP_S = 120  # importing torch through transformers is slow on a busy 2-core machine
PROMPT_EXIT_S = 20


def _as_in_a_terminal() -> None:
    """Ctrl-C reaches the child even when the tests run as a background job (which ignores SIGINT)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


class EnvProcess:
    """A `serve` env process with its log; always stopped at the end."""

    def __init__(self, command: list[str], log_path: Path) -> None:
        self.log_path = log_path
        self.process = subprocess.Popen(command, cwd=log_path.parent, stdout=open(log_path, "ab"),
                                        stderr=subprocess.STDOUT, preexec_fn=_as_in_a_terminal)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_for(self, condition: Callable[[], bool], what: str, timeout: float = STARTUP_S) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if condition():
                return
            if self.process.poll() is not None:
                pytest.fail(f"env exited ({self.process.returncode}) before {what}:\n{self.log()[-3000:]}")
            time.sleep(0.2)
        pytest.fail(f"timed out waiting for {what}:\n{self.log()[-3000:]}")

    def wait_for_log(self, text: str, timeout: float = STARTUP_S) -> None:
        self.wait_for(lambda: text in self.log(), repr(text), timeout)

    def stop_with(self, signum: int, timeout: float = PROMPT_EXIT_S) -> tuple[int, float]:
        """Send `signum`; the exit code and the seconds it took to exit."""
        sent = time.monotonic()
        self.process.send_signal(signum)
        try:
            code = self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            pytest.fail(f"env still running {timeout} s after {signal.Signals(signum).name}:\n{self.log()[-3000:]}")
        return code, time.monotonic() - sent

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)


@pytest.fixture
def slow_inference() -> Iterator[str]:
    """An inference server that takes 20 s per request: rollouts stay in flight."""
    process, url = start_fake_inference(latency=20.0)
    yield url
    process.kill()  # a graceful stop would wait for the slow requests
    process.wait(10)


def serve_flags(api_url: str, tokenizer_dir: Path, tmp_path: Path, inference_url: str = "http://127.0.0.1:9/v1") -> list[str]:
    return ["--env.tokenizer_name", str(tokenizer_dir), "--env.rollout_server_url", api_url,
            "--openai.base_url", inference_url, "--openai.model_name", "fake-model", "--env.use_wandb", "false",
            "--env.spool_dir", str(tmp_path / "spool"), "--env.max_num_workers", "2",
            "--env.progress_log_interval", "1", "--env.total_steps", "1000"]


def start_env(tmp_path: Path, flags: list[str], script: Optional[Path] = None) -> EnvProcess:
    command = [sys.executable, str(script), "serve", *flags] if script else env_command("serve", *flags)
    return EnvProcess(command, tmp_path / "env.log")


def start_trainer(api_url: str, batch_size: int = 8, first_batch: bool = True) -> None:
    httpx.post(api_url + "/register", json=registration(batch_size)).raise_for_status()
    if first_batch:
        httpx.get(api_url + "/batch").raise_for_status()


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_stops_while_waiting_for_the_trainer(signum: int, tokenizer_dir: Path, tmp_path: Path) -> None:
    with ApiProcess(None, "--ephemeral") as api:
        env = start_env(tmp_path, serve_flags(api.url, tokenizer_dir, tmp_path))
        try:
            env.wait_for_log("waiting for the trainer to register")
            code, _ = env.stop_with(signum)
        finally:
            env.kill()
        assert code == 0, env.log()[-3000:]
        name = signal.Signals(signum).name
        assert f"serve stopped ({name} received)" in env.log()
        assert "Traceback" not in env.log()


def test_stops_while_registering(tokenizer_dir: Path, tmp_path: Path) -> None:
    with ApiProcess(None, "--ephemeral") as api:
        start_trainer(api.url, first_batch=False)  # the API holds envs back until the trainer's first /batch
        env = start_env(tmp_path, serve_flags(api.url, tokenizer_dir, tmp_path))
        try:
            env.wait_for_log("registering with the API: wait for trainer to start")
            code, _ = env.stop_with(signal.SIGINT)
        finally:
            env.kill()
        assert code == 0, env.log()[-3000:]
        assert "serve stopped (SIGINT received)" in env.log()
        assert httpx.get(api.url + "/envs").json()["envs"] == []


def test_second_ctrl_c_cancels_rollouts_in_flight_and_disconnects(
    tokenizer_dir: Path, slow_inference: str, tmp_path: Path
) -> None:
    with ApiProcess(None, "--ephemeral") as api:
        start_trainer(api.url)
        env = start_env(tmp_path, serve_flags(api.url, tokenizer_dir, tmp_path, slow_inference))
        try:
            env.wait_for_log("2 groups in progress")
            env.process.send_signal(signal.SIGINT)
            env.wait_for_log("waiting up to 30s for 2 groups in progress", timeout=PROMPT_EXIT_S)
            code, _ = env.stop_with(signal.SIGINT)
        finally:
            env.kill()
        assert code == 0, env.log()[-3000:]
        log = env.log()
        assert "cancelled 2 groups in progress" in log and "serve stopped (SIGINT received)" in log
        assert httpx.get(api.url + "/envs").json()["envs"][0]["connected"] is False


def test_stops_while_the_api_is_down_and_keeps_the_spool(tokenizer_dir: Path, tmp_path: Path) -> None:
    inference, inference_url = start_fake_inference(latency=2.0)
    api = ApiProcess(tmp_path / "state").start()
    env: Optional[EnvProcess] = None
    stats_url = inference_url.removesuffix("/v1") + "/stats"
    try:
        start_trainer(api.url)
        env = start_env(tmp_path, serve_flags(api.url, tokenizer_dir, tmp_path, inference_url))
        env.wait_for(lambda: httpx.get(api.url + "/status").json()["queue_size"] >= 2, "groups at the API")
        # a rollout in flight when the API dies is what must end up in the spool
        env.wait_for(lambda: httpx.get(stats_url).json()["in_flight"] > 0, "a rollout in flight")
        api.kill9()
        spool = tmp_path / "spool"
        env.wait_for(lambda: any(spool.glob("*.json")), "a spooled submission", timeout=60)
        code, _ = env.stop_with(signal.SIGINT)
        assert code == 0, env.log()[-3000:]
        assert any(spool.glob("*.json"))
        assert "remain spooled in" in env.log() and "serve stopped (SIGINT received)" in env.log()
    finally:
        if env is not None:
            env.kill()
        api.stop()
        inference.terminate()
        inference.wait(10)


BLOCKING_SETUP_ENV = textwrap.dedent('''
    import sys
    import time

    sys.path.insert(0, {environments!r})
    from arithmetic_env import ArithmeticEnv


    class BlockingSetupEnv(ArithmeticEnv):
        async def setup(self):
            print("setup started", flush=True)
            time.sleep(600)  # synchronous work that blocks the event loop


    if __name__ == "__main__":
        BlockingSetupEnv.cli()
''')


def test_second_signal_breaks_out_of_a_blocking_setup(tokenizer_dir: Path, tmp_path: Path) -> None:
    script = tmp_path / "blocking_env.py"
    script.write_text(BLOCKING_SETUP_ENV.format(environments=str(ROOT / "environments")))
    with ApiProcess(None, "--ephemeral") as api:
        env = start_env(tmp_path, serve_flags(api.url, tokenizer_dir, tmp_path), script=script)
        try:
            env.wait_for_log("setup started")
            env.process.send_signal(signal.SIGINT)
            time.sleep(0.5)
            code, _ = env.stop_with(signal.SIGINT)
        finally:
            env.kill()
        assert code == 130, env.log()[-3000:]
        assert "interrupted" in env.log()
