"""A local vLLM OpenAI-compatible server: start it on a model, wait until it answers, stop it.

    atropos-vllm serve [--model DIR] [--port 9001]

On CPU machines the launch uses the settings that make vLLM's CPU build start quickly and
use every core: ``--enforce-eager`` (no graph compilation at each start), a 1 GiB KV
cache, OpenMP threads bound to all cores, bfloat16 weights. ``VLLM_SERVER_DEV_MODE=1`` is
set so a trainer can swap in new weights (``/collective_rpc`` ``reload_weights``).
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Optional

import httpx

from atroposlib.local.paths import atropos_home
from atroposlib.local.prepare_model import ModelPreparationError, prepare_model
from atroposlib.local.runtime import Runtime

DEFAULT_SERVED_NAME = "smollm2"


class VLLMStartError(RuntimeError):
    """The vLLM server exited or did not become healthy in time."""


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class LocalVLLM:
    """One vLLM server process; a context manager that always stops it."""

    def __init__(self, model_dir: Path, port: Optional[int] = None, served_name: str = DEFAULT_SERVED_NAME,
                 max_model_len: int = 2048, runtime: Optional[Runtime] = None, extra_args: tuple[str, ...] = (),
                 log_path: Optional[Path] = None) -> None:
        self.model_dir = Path(model_dir)
        self.port = port or _free_port()
        self.served_name = served_name
        self.max_model_len = max_model_len
        self.runtime = runtime or Runtime()
        self.extra_args = extra_args
        self.log_path = log_path or atropos_home() / "logs" / f"vllm-{self.port}.log"
        self.process: Optional[subprocess.Popen[bytes]] = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def command(self) -> list[str]:
        return [str(self.runtime.python), "-m", "vllm.entrypoints.openai.api_server", "--model", str(self.model_dir),
                "--served-model-name", self.served_name, "--host", "127.0.0.1", "--port", str(self.port),
                "--dtype", "bfloat16", "--max-model-len", str(self.max_model_len), "--enforce-eager",
                *self.extra_args]

    def environment(self) -> dict[str, str]:
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "VLLM_SERVER_DEV_MODE": "1",
               "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1"}
        info = self.runtime.info()
        if info is None or info.device == "cpu":
            cores = os.cpu_count() or 1
            env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
            env.setdefault("VLLM_CPU_OMP_THREADS_BIND", f"0-{cores - 1}")
        return env

    def start(self, timeout: float = 300.0) -> "LocalVLLM":
        if not self.runtime.python.exists():
            raise VLLMStartError(f"no vLLM runtime at {self.runtime.path}: run `atropos-vllm install`")
        if not (self.model_dir / "config.json").exists():
            raise VLLMStartError(f"{self.model_dir} is not a model folder: run `atropos-prepare-model`")
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "ab")
        self.process = subprocess.Popen(self.command(), stdout=log, stderr=subprocess.STDOUT,
                                        env=self.environment(), start_new_session=True)
        self._wait_healthy(timeout)
        return self

    def _wait_healthy(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.process is not None
            if self.process.poll() is not None:
                raise VLLMStartError(f"vLLM exited with code {self.process.returncode}; last log lines:\n{self.log_tail()}")
            try:
                if httpx.get(f"http://127.0.0.1:{self.port}/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        self.stop()
        raise VLLMStartError(f"vLLM did not answer within {timeout:.0f} s; last log lines:\n{self.log_tail()}")

    def log_tail(self, lines: int = 25) -> str:
        if not self.log_path.exists():
            return ""
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def stop(self, grace: float = 20.0) -> None:
        """SIGTERM the server's process group, then SIGKILL what is left after `grace` seconds."""
        if self.process is None or self.process.poll() is not None:
            return
        os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(grace)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()

    def reload_weights(self, weights_dir: Path, timeout: float = 300.0) -> float:
        """Swap the served weights for those in `weights_dir` (same architecture) without a
        restart, as a trainer does after each checkpoint; returns the seconds it took.

        Generation is paused, the weights are re-read, the prefix cache (built with the old
        weights) is dropped and generation resumes, even if the reload failed.
        """
        started = time.monotonic()
        root = f"http://127.0.0.1:{self.port}"
        with httpx.Client(timeout=timeout) as client:
            client.post(f"{root}/pause").raise_for_status()
            try:
                client.post(f"{root}/collective_rpc", json={
                    "method": "reload_weights", "kwargs": {"weights_path": str(weights_dir)}}).raise_for_status()
                client.post(f"{root}/reset_prefix_cache").raise_for_status()
            finally:
                client.post(f"{root}/resume").raise_for_status()
        return time.monotonic() - started

    def openai_flags(self) -> list[str]:
        """The environment flags that point an env at this server."""
        return ["--openai.base_url", self.base_url, "--openai.model_name", self.served_name,
                "--openai.server_type", "vllm", "--openai.tokenizer_name", str(self.model_dir),
                "--openai.api_key", "x", "--env.tokenizer_name", str(self.model_dir)]

    def __enter__(self) -> "LocalVLLM":
        return self.start()

    def __exit__(self, *exc_info: Any) -> None:
        self.stop()


def _serve(args: argparse.Namespace) -> None:
    model_dir = prepare_model(args.model)
    server = LocalVLLM(model_dir, port=args.port, served_name=args.served_name, max_model_len=args.max_model_len)
    started = time.monotonic()
    print(f"starting vLLM on {model_dir} (log: {server.log_path})", flush=True)
    with server:
        print(f"vLLM is up at {server.base_url} after {time.monotonic() - started:.1f} s. Point environments at it with:")
        print("  " + " ".join(server.openai_flags()), flush=True)
        try:
            while server.process is not None and server.process.poll() is None:
                time.sleep(1)
        except KeyboardInterrupt:
            print("stopping vLLM")


def _install(args: argparse.Namespace) -> None:
    runtime = Runtime(args.path)
    info = runtime.install(args.device)
    print(f"vLLM runtime ({info.device}) in {runtime.path}: {info.size_bytes / 1e9:.2f} GB, "
          f"installed in {info.install_seconds:.0f} s")


def main(argv: Optional[list[str]] = None) -> None:
    parser = argparse.ArgumentParser(prog="atropos-vllm", description="Local vLLM inference for environments.")
    commands = parser.add_subparsers(dest="command", required=True)
    install = commands.add_parser("install", help="Create the vLLM runtime (CPU build without an NVIDIA GPU).")
    install.add_argument("--device", choices=["auto", "cpu", "gpu"], default="auto")
    install.add_argument("--path", type=Path, help="Runtime folder (default: $ATROPOS_HOME/vllm-runtime).")
    serve = commands.add_parser("serve", help="Serve a model and print the --openai.* flags to use.")
    serve.add_argument("--model", help="Model folder, GGUF file or hub name (default: bundled SmolLM2).")
    serve.add_argument("--port", type=int, default=9001)
    serve.add_argument("--served-name", default=DEFAULT_SERVED_NAME)
    serve.add_argument("--max-model-len", type=int, default=2048)
    args = parser.parse_args(argv)
    try:
        (_install if args.command == "install" else _serve)(args)
    except (VLLMStartError, ModelPreparationError, subprocess.CalledProcessError, FileNotFoundError) as exc:
        sys.exit(f"error: {exc}")


if __name__ == "__main__":
    main()
