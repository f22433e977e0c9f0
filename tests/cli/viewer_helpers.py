"""Groups made with a real tokenizer, and `view-run` processes started and stopped by the tests."""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Iterable, Optional, Sequence

import httpx
import pytest

from tests.helpers import free_port

HOSTILE = ('<script>window.__pwned = 1</script><img src=x onerror="window.__pwned = 2">'
           " ${window.__pwned = 3} {{constructor.constructor('window.__pwned = 4')()}}")


def require_gradio() -> None:
    """Skip a test of the running app where Gradio (the `examples` extra) is not installed."""
    if importlib.util.find_spec("gradio") is None:
        pytest.skip("the viewer's Gradio is in the examples extra")


def sequence(tokenizer: Any, prompt: str, completion: str) -> tuple[list[int], list[int]]:
    """Tokens of a chat rollout and its mask: the prompt untrained, the completion trained."""
    text = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False,
                                         add_generation_prompt=True)
    prompt_tokens = tokenizer(text, add_special_tokens=False)["input_ids"]
    completion_tokens = tokenizer(completion + "<|end|>", add_special_tokens=False)["input_ids"]
    return prompt_tokens + completion_tokens, [-100] * len(prompt_tokens) + completion_tokens


def make_group(tokenizer: Any, prompt: str, completions: Sequence[str], scores: Sequence[float],
               env_id: Optional[int] = 0, **extra: Any) -> dict[str, Any]:
    """A scored group as `process` writes it (and as environments POST it to the API)."""
    pairs = [sequence(tokenizer, prompt, completion) for completion in completions]
    group = {"tokens": [tokens for tokens, _ in pairs], "masks": [mask for _, mask in pairs],
             "scores": list(scores), **extra}
    if env_id is not None:
        group["env_id"] = env_id
    return group


def write_jsonl(path: Path, groups: Iterable[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(group) + "\n" for group in groups))
    return path


class ViewerProcess:
    """A `view-run` (or `view-run-multimodal`) child process on a free port; always stopped on exit."""

    def __init__(self, log_dir: Path, *args: str, module: str = "atroposlib.cli.view_run") -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/"
        self.args = [sys.executable, "-m", module, "--port", str(self.port), *args]
        self.log_path = log_dir / f"viewer-{self.port}.log"
        self.process: Optional[subprocess.Popen[bytes]] = None

    def launch(self) -> "ViewerProcess":
        """Start the process without waiting (viewers start in parallel: Gradio is slow to import)."""
        env = {**os.environ, "HF_HUB_OFFLINE": "1"}
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen(self.args, stdout=log, stderr=subprocess.STDOUT, env=env)
        return self

    def start(self, timeout: float = 120.0) -> "ViewerProcess":
        """Launch (unless launched) and wait until the page answers or the process has exited."""
        if self.process is None:
            self.launch()
        assert self.process is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                return self  # exited: the test looks at returncode and log()
            try:
                if httpx.get(self.url, timeout=2).status_code == 200:
                    return self
            except httpx.HTTPError:
                time.sleep(0.3)
        self.stop()
        raise TimeoutError(f"the viewer did not answer within {timeout} s: {self.log()}")

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def wait(self, timeout: float = 30.0) -> int:
        assert self.process is not None
        return self.process.wait(timeout)

    def stop(self, signum: int = signal.SIGTERM) -> Optional[int]:
        """Send `signum` and wait; the exit status (killed if it does not stop within 20 s)."""
        if self.process is None:
            return None
        if self.process.poll() is None:
            self.process.send_signal(signum)
            try:
                self.process.wait(20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
        return self.process.returncode

    def __enter__(self) -> "ViewerProcess":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
