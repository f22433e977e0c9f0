"""The trainer's own vLLM server: the python that runs it, starting it on a model or a
checkpoint, swapping new weights or LoRA adapters into it, and stopping it.

The server is the bundled `vllm_api_server.py`, launched through
`atroposlib.local.vllm_service.LocalVLLM`: in a process group of its own, which `stop`
ends as a whole (SIGTERM, SIGKILL after a grace period, then a wait) and nothing else.
A port that some other process already listens on is `PortInUseError`: the trainer never
stops processes it did not start. The python is, in this order, ``--vllm-python``, the
trainer's own interpreter when vLLM imports there (a GPU machine with vllm installed), or
the runtime ``atropos-vllm install`` made (a CPU machine, where vLLM cannot share the
trainer's environment). On a CPU, a run that restarts its server forks every start from a
process that imported the server program once (`atroposlib.local.forkserver`).
"""

from __future__ import annotations

import importlib.util
import os
import shlex
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

import httpx

from atroposlib.local.forkserver import ForkServer
from atroposlib.local.runtime import Runtime
from atroposlib.local.token_progress import read_counters
from atroposlib.local.vllm_service import LocalVLLM, PortInUseError, VLLMStartError

if TYPE_CHECKING:
    from example_trainer.config import TrainingConfig

__all__ = ["PortInUseError", "TrainerVLLM", "VLLMPythonNotFoundError", "VLLMRequestError", "VLLMStartError",
           "check_vllm_health", "hotswap_lora_adapter", "resolve_vllm_python", "wait_for_vllm_ready"]

SERVER_SCRIPT = Path(__file__).resolve().with_name("vllm_api_server.py")
# the ranks vLLM accepts for --max-lora-rank
VLLM_LORA_RANKS = (8, 16, 32, 64, 128, 256, 320, 512)
ADAPTER_NAME = "training_adapter"


class VLLMPythonNotFoundError(RuntimeError):
    """No python interpreter that can run vLLM was found."""


class VLLMRequestError(RuntimeError):
    """The trainer's vLLM server refused or failed a request."""


def _vllm_importable() -> bool:
    return importlib.util.find_spec("vllm") is not None


def resolve_vllm_python(config: "TrainingConfig") -> Path:
    """The interpreter that runs the server: ``config.vllm_python``, else this one when vLLM
    imports here, else the ``atropos-vllm install`` runtime's."""
    if config.vllm_python:
        python = Path(config.vllm_python)
        if not python.exists():
            raise VLLMPythonNotFoundError(f"--vllm-python {python}: no such file")
        return python
    if _vllm_importable():
        return Path(sys.executable)
    runtime = Runtime()
    if runtime.is_installed():
        return runtime.python
    raise VLLMPythonNotFoundError(
        "no python with vLLM: pass --vllm-python PATH, install vllm into this environment (GPU machines), "
        f"or run `atropos-vllm install` (a CPU runtime in {runtime.path})")


def _lora_rank(r: int) -> int:
    wanted = max(2 * r, 32)
    return next((rank for rank in VLLM_LORA_RANKS if rank >= wanted), VLLM_LORA_RANKS[-1])


def _root(port: int) -> str:
    return f"http://127.0.0.1:{port}"


_NO_SUCH_ROUTE = (404, 405, 501)


def _checked(response: httpx.Response, what: str) -> dict[str, Any]:
    if response.status_code >= 400:
        try:
            detail = response.json().get("detail", response.text)
        except ValueError:
            detail = response.text
        raise VLLMRequestError(f"{what} failed ({response.status_code}): {detail}")
    return response.json() if response.content else {}


def _load_adapter(port: int, name: str, path: str, policy_version: Optional[int] = None,
                  timeout: float = 300.0) -> None:
    """vLLM's own ``/v1/load_lora_adapter`` when the server has it, else the bundled ``/lora/load``
    (which also takes the `policy_version` to report; vLLM's own route knows none)."""
    with httpx.Client(timeout=timeout) as client:
        response = client.post(f"{_root(port)}/v1/load_lora_adapter", json={"lora_name": name, "lora_path": path})
        if response.status_code == 404:
            body: dict[str, Any] = {"adapter_path": path, "adapter_name": name}
            if policy_version is not None:
                body["policy_version"] = policy_version
            response = client.post(f"{_root(port)}/lora/load", json=body)
        _checked(response, f"loading adapter {path}")


def check_vllm_health(port: int) -> bool:
    try:
        return httpx.get(f"{_root(port)}/health", timeout=5.0).status_code == 200
    except httpx.HTTPError:
        return False


def wait_for_vllm_ready(port: int, timeout: float = 120.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check_vllm_health(port):
            return True
        time.sleep(1.0)
    return False


def hotswap_lora_adapter(adapter_name: str, adapter_path: str, port: int, policy_version: Optional[int] = None) -> bool:
    """Make the server on `port` sample with the adapter in `adapter_path` (reporting
    `policy_version` where it can); False (and the reason printed) when it could not."""
    try:
        _load_adapter(port, adapter_name, adapter_path, policy_version)
    except (VLLMRequestError, httpx.HTTPError) as exc:
        print(f"could not hot-swap adapter {adapter_path}: {exc}", flush=True)
        return False
    return True


class TrainerVLLM:
    """The vLLM server one training run starts, restarts and stops; a context manager that
    always stops it. ``start`` and friends return the seconds they took."""

    def __init__(self, config: "TrainingConfig", log_path: Path) -> None:
        self.config = config
        self.log_path = Path(log_path)
        self.python = resolve_vllm_python(config)
        self.dtype = config.resolved_vllm_dtype()
        self.server: Optional[LocalVLLM] = None
        self.forkserver: Optional[ForkServer] = None
        self.model_path: Optional[str] = None
        # what `launch` started and when, until `start` waits for it
        self._launched: Optional[tuple[str, int, float]] = None

    @property
    def port(self) -> int:
        return self.config.vllm_port

    @property
    def base_url(self) -> str:
        return f"{_root(self.port)}/v1"

    def _lora_args(self, adapter: Optional[str]) -> tuple[str, ...]:
        if adapter is None and self.config.weight_bridge_mode not in ("lora_only", "lora_restart"):
            return ()
        return ("--enable-lora", "--max-lora-rank", str(_lora_rank(self.config.lora_r)))

    def server_for(self, model_path: str, adapter: Optional[str] = None, policy_version: int = 0) -> LocalVLLM:
        """The launcher for the bundled server on `model_path`, reporting `policy_version` (not started)."""
        environ = {} if self.config.vllm_gpu is None else {"CUDA_VISIBLE_DEVICES": str(self.config.vllm_gpu)}
        server = LocalVLLM(Path(model_path), port=self.port, served_name=self.config.model_name,
                           max_model_len=self.config.max_model_len,
                           extra_args=("--policy-version", str(policy_version), *self._lora_args(adapter)),
                           log_path=self.log_path, dtype=self.dtype.dtype, python=self.python,
                           entrypoint=(str(SERVER_SCRIPT),), environ=environ,
                           allocator=self.config.cpu_allocator)
        if server.gpu:
            # on a CPU this flag would reserve that fraction of RAM for vLLM's KV cache
            server.extra_args += ("--gpu-memory-utilization", str(self.config.vllm_gpu_memory_utilization))
            # frequent restarts pay CUDA-graph capture once each but generate faster in between
            server.enforce_eager = self.config.weight_bridge_mode != "lora_restart"
        return server

    def command_line(self, model_path: str) -> str:
        """The shell command `start` runs on `model_path` (LoRA on in the LoRA modes), for users who
        start the server themselves: with the environment variables vLLM's CPU backend needs, as
        without ``VLLM_CPU_KVCACHE_SPACE`` it reserves most of the RAM and fails on a busy machine."""
        server = self.server_for(model_path)
        environment = server.environment()
        cpu = [f"{name}={value}" for name, value in sorted(environment.items())
               if name.startswith("VLLM_CPU_") and os.environ.get(name) != value]
        return shlex.join([*cpu, *server.command()])

    @property
    def on_cpu(self) -> bool:
        """Whether the server runs vLLM's CPU build (its python and the machine say so)."""
        return not self.server_for(self.config.model_name).gpu

    def launch(self, model_path: str, policy_version: int = 0, adapter: Optional[str] = None) -> None:
        """Start the server's process on `model_path`, reporting `policy_version`, and return at
        once: `start` on the same model and version then waits for it (and loads the adapter)."""
        if self.is_running():
            raise VLLMStartError(f"the trainer's vLLM already runs on port {self.port}")
        server = self.server_for(model_path, adapter, policy_version)
        server.forkserver = self._forkserver_for(server)
        server.launch()
        self.server, self.model_path = server, model_path
        self._launched = (model_path, policy_version, time.monotonic())

    @property
    def restarts(self) -> bool:
        """Whether the run starts its server more than once (a restart to sync weights, or a stop
        while each step trains)."""
        return self.config.weight_bridge_mode in ("none", "lora_restart") or self.config.vllm_stop_during_train

    def _forkserver_for(self, server: LocalVLLM) -> Optional[ForkServer]:
        """Where a run that restarts a CPU server forks it from (each start after the first skips
        vLLM's import: 12 -> 5 s on a 2-core EPYC, `bench/vllm_start.py`): one fork server,
        replaced should the server's python or environment change. None on a GPU, where it is
        not tried, for a server started once, and with ``--no-vllm-fork-server``."""
        if server.gpu or not self.restarts or not self.config.vllm_fork_server:
            return None
        environment = server.environment()
        if self.forkserver is None or not self.forkserver.serves(server.python, server.entrypoint, environment):
            self.close_forkserver()
            self.forkserver = ForkServer(server.python, server.entrypoint, environment, self.log_path)
        return self.forkserver

    def close_forkserver(self) -> None:
        if self.forkserver is not None:
            self.forkserver.close()
            self.forkserver = None

    def start(self, model_path: str, *, adapter: Optional[str] = None, policy_version: int = 0,
              timeout: float = 600.0) -> float:
        """Launch the server on `model_path` (and activate `adapter`), reporting `policy_version`,
        once it answers /health; the seconds since `launch` when it launched that already."""
        if self._launched is not None and self._launched[:2] != (model_path, policy_version):
            self.stop()  # launched on other weights than the run starts from
        if self._launched is None:
            self.launch(model_path, policy_version, adapter)
        assert self.server is not None and self._launched is not None
        started, self._launched = self._launched[2], None
        self.server.wait_until_ready(timeout)
        if adapter is not None:
            self.load_lora_adapter(ADAPTER_NAME, adapter, policy_version)
        return time.monotonic() - started

    def stop(self, grace: float = 20.0) -> None:
        """End the server's process group (SIGTERM, then SIGKILL after `grace` seconds) and wait."""
        if self.server is not None:
            self.server.stop(grace)
            self.server = None
        self._launched = None

    def close(self) -> None:
        """Stop the server and the fork server it came from, at the end of the run."""
        self.stop()
        self.close_forkserver()

    def restart(self, model_path: str, *, adapter: Optional[str] = None, policy_version: int = 0,
                timeout: float = 600.0) -> float:
        started = time.monotonic()
        self.stop()
        self.start(model_path, adapter=adapter, policy_version=policy_version, timeout=timeout)
        return time.monotonic() - started

    def reload_weights(self, weights_dir: str, policy_version: int, timeout: float = 600.0) -> float:
        """Swap in the weights saved in `weights_dir` (same architecture) without a restart; the
        server then reports `policy_version`."""
        started = time.monotonic()
        response = httpx.post(f"{_root(self.port)}/reload_weights",
                              json={"weights_path": str(weights_dir), "policy_version": policy_version},
                              timeout=timeout)
        _checked(response, f"reloading weights from {weights_dir}")
        return time.monotonic() - started

    def pause_generation(self) -> bool:
        """Freeze the server's requests where they are (``/bridge/pause?mode=keep``), so that a
        training step has the CPU cores to itself; `resume_generation` lets them go on. False
        when the server has no such route (a vLLM script of the user's own): it keeps serving."""
        response = httpx.post(f"{_root(self.port)}/bridge/pause", params={"mode": "keep"}, timeout=60)
        if response.status_code in _NO_SUCH_ROUTE:
            return False
        _checked(response, "pausing generation")
        return True

    def resume_generation(self) -> None:
        _checked(httpx.post(f"{_root(self.port)}/bridge/resume", timeout=60), "resuming generation")

    def load_lora_adapter(self, name: str, path: str, policy_version: Optional[int] = None) -> float:
        started = time.monotonic()
        _load_adapter(self.port, name, path, policy_version)
        return time.monotonic() - started

    def generated_tokens(self) -> Optional[float]:
        """The tokens the server has generated since it started (vLLM's Prometheus counter
        ``vllm:generation_tokens_total``); None when it has no ``/metrics`` or does not answer."""
        counters = read_counters(_root(self.port), timeout=5)
        return None if counters is None else counters.generated_tokens

    def is_running(self) -> bool:
        return self.server is not None and self.server.process is not None and self.server.process.poll() is None

    def __enter__(self) -> "TrainerVLLM":
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()


class GenerationMeter:
    """The trainer's vLLM's generation speed: tokens generated per wall-clock second between
    two readings (None for the first, and after a restart reset the counter)."""

    def __init__(self, vllm: Optional[TrainerVLLM]) -> None:
        self.vllm = vllm
        self.last: Optional[tuple[float, float]] = None

    def tokens_per_s(self) -> Optional[float]:
        tokens = self.vllm.generated_tokens() if self.vllm is not None and self.vllm.is_running() else None
        now, previous = time.monotonic(), self.last
        self.last = (now, tokens) if tokens is not None else None
        if tokens is None or previous is None or tokens < previous[1] or now <= previous[0]:
            return None
        return (tokens - previous[1]) / (now - previous[0])
