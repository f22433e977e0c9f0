"""Fixtures for environment tests: a tokenizer folder and a fake inference server process."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

import httpx
import pytest

from tests.helpers import free_port

ROOT = Path(__file__).resolve().parent.parent.parent


def start_fake_inference(latency: float = 0.0) -> tuple[subprocess.Popen, str]:
    port = free_port()
    process = subprocess.Popen([sys.executable, "-m", "tests.fake_openai", "--port", str(port), "--latency", str(latency)], cwd=ROOT)
    url = f"http://127.0.0.1:{port}"
    for _ in range(100):
        try:
            if httpx.get(url + "/health", timeout=1).status_code == 200:
                return process, url + "/v1"
        except httpx.HTTPError:
            time.sleep(0.1)
    process.kill()
    raise RuntimeError("fake inference server did not start")


@pytest.fixture(scope="session")
def inference_url() -> Iterator[str]:
    process, url = start_fake_inference()
    yield url
    process.terminate()
    process.wait(10)


def env_command(mode: str, *flags: str) -> list[str]:
    return [sys.executable, str(ROOT / "environments" / "arithmetic_env.py"), mode, *flags]
