"""A local vLLM OpenAI-compatible server: start it on a model, wait until it answers, stop it.

    atropos-vllm serve [--model DIR] [--port 9001] [--dtype auto]

On CPU machines the launch uses the settings that make vLLM's CPU build start quickly and
use every core: ``--enforce-eager`` (no graph compilation at each start), a 1 GiB KV
cache (2 GiB in float32), OpenMP threads on all cores, and the dtype the CPU is fast
in (bfloat16 only with bf16 instructions, else float32: see `atroposlib.local.cpu`), and the
engine core forked from the API server rather than spawned, running the model itself rather
than in a spawned worker (``vllm_plugins/atropos_engine_fork.py``: no second or third import
of vLLM: 22.5 s to answer instead of 51.5 s on 2 cores, `bench/vllm_start.py`).
The server program is stock vLLM's OpenAI server unless another entrypoint is given (the
GRPO trainer launches its own, `example_trainer/vllm_api_server.py`, the same way); a port
some other process already listens on is an error (`PortInUseError`), never taken over.

For RL, the stock server is started with ``--logprobs-mode processed_logprobs`` (the
log-probabilities of the distribution tokens are drawn from, after temperature, min-p,
top-k and top-p, which a trainer's importance ratio needs: vLLM's default reports the raw
model's), ``--generation-config vllm`` (a request that names no temperature gets 1.0, not
the model's own default, so environments' records of the request are the truth) and the
middleware `atropos_policy_version` (every answer says which weights it came from, and
`reload_weights` updates it: `atroposlib.policy_version`); its in-place weight reloads keep
a tied LM head on the new embedding (`atropos_worker` in ``vllm_plugins/``).
``VLLM_SERVER_DEV_MODE=1`` is set so a trainer can swap in new weights (``/collective_rpc``
``reload_weights``), and vLLM's cache is in ``$ATROPOS_HOME/vllm-cache`` unless
``VLLM_CACHE_ROOT`` says otherwise (`atroposlib.local.paths.vllm_cache_dir`: a start with
another HOME reuses it). vLLM's processes talk over Unix sockets it makes in the temporary
folder and leaves there when it is stopped by a signal (two a start: a run restarting vLLM each
step would fill ``/tmp``); each launch gives them a folder of its own (``VLLM_RPC_BASE_PATH``,
unless set), removed on `stop`. The server runs in a process group of its own, stopped as a
whole on `stop`, on SIGINT, SIGTERM or SIGHUP to the wrapper, and (Linux) when the wrapper dies.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence, Union

import httpx

from atroposlib.local.allocator import Allocator, find_library, with_fast_allocator
from atroposlib.local.cpu import DTYPES, Dtype, DtypeChoice, choose_dtype, read_cpu
from atroposlib.local.forkserver import ForkedServer, ForkServer
from atroposlib.local.help_format import DefaultsHelpFormatter
from atroposlib.local.paths import atropos_home, vllm_cache_dir
from atroposlib.local.prepare_model import ModelPreparationError, prepare_model
from atroposlib.local.runtime import Runtime, has_nvidia_gpu
from atroposlib.local.signals import die_with_parent, signal_group, stop_signals_raise

DEFAULT_SERVED_NAME = "smollm2"
STOCK_ENTRYPOINT = ("-m", "vllm.entrypoints.openai.api_server")
# the policy-version middleware and the reload worker extension, imported by the server from this
# folder (its own runtime has no atroposlib)
PLUGINS_DIR = Path(__file__).resolve().with_name("vllm_plugins")
# vLLM names its sockets ipc://FOLDER/<uuid4>: a Unix socket's path holds at most 107 bytes
_LONGEST_IPC_FOLDER = 107 - 37


def _private_ipc_folder() -> Optional[Path]:
    """A new folder for one server's IPC sockets in the temporary folder, or None (vLLM's default)
    where the temporary folder's path is too long to hold one."""
    if len(os.path.join(tempfile.gettempdir(), "vllm-ipc-12345678")) > _LONGEST_IPC_FOLDER:
        return None
    return Path(tempfile.mkdtemp(prefix="vllm-ipc-"))


STOCK_RL_FLAGS = ("--logprobs-mode", "processed_logprobs", "--generation-config", "vllm",
                  "--middleware", "atropos_policy_version.policy_version",
                  "--worker-extension-cls", "atropos_worker.ReloadWorkerExtension")


class VLLMStartError(RuntimeError):
    """The vLLM server exited or did not become healthy in time."""


class PortInUseError(VLLMStartError):
    """Another process already listens on the port the server was to use."""


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def port_in_use(port: int) -> bool:
    """Whether something listens on `port` of the loopback interface (or of all interfaces)."""
    with socket.socket() as sock:
        # a closed connection's TIME_WAIT does not count as in use
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return True
    return False


class LocalVLLM:
    """One vLLM server process; a context manager that always stops it.

    ``dtype="auto"`` picks the dtype from the CPU (or leaves it to vLLM on a GPU); the
    choice and the reason for it are in `self.dtype`. `python` runs the server instead of
    the runtime's interpreter (any python where vLLM imports), `entrypoint` names the
    program (``-m module`` or a script path), `environ` adds to the server's environment
    and `enforce_eager=False` lets vLLM compile graphs (slower starts, faster on a GPU). On a
    CPU the server gets `allocator` preloaded where one is installed, as vLLM advises
    (`atroposlib.local.allocator`; ``system``: glibc's). A launch that `forkserver` serves is
    forked from it (`atroposlib.local.forkserver`), skipping the import of vLLM.
    """

    def __init__(self, model_dir: Path, port: Optional[int] = None, served_name: str = DEFAULT_SERVED_NAME,
                 max_model_len: int = 2048, runtime: Optional[Runtime] = None, extra_args: tuple[str, ...] = (),
                 log_path: Optional[Path] = None, dtype: Dtype = "auto", *, python: Optional[Path] = None,
                 entrypoint: Sequence[str] = STOCK_ENTRYPOINT, environ: Optional[Mapping[str, str]] = None,
                 enforce_eager: bool = True, allocator: Allocator = "auto",
                 forkserver: Optional[ForkServer] = None) -> None:
        self.model_dir = Path(model_dir)
        self.port = port or free_port()
        self.served_name = served_name
        self.max_model_len = max_model_len
        self.runtime = runtime or Runtime()
        self.extra_args = extra_args
        self.log_path = log_path or atropos_home() / "logs" / f"vllm-{self.port}.log"
        self.python = Path(python) if python is not None else self.runtime.python
        self.entrypoint = tuple(entrypoint)
        self.environ = dict(environ or {})
        self.enforce_eager = enforce_eager
        self.allocator = allocator
        self.forkserver = forkserver
        self.process: Optional[Union[subprocess.Popen[bytes], ForkedServer]] = None
        # the folder of the running server's IPC sockets, when this launch made it
        self.ipc_folder: Optional[Path] = None
        self._stopped = False
        self.gpu = self._on_gpu()
        self.dtype: DtypeChoice = choose_dtype(read_cpu().flags, dtype, gpu=self.gpu)

    def _on_gpu(self) -> bool:
        """Whether the server runs vLLM's GPU build: the runtime says so, or (for another
        python) an NVIDIA GPU is present."""
        if self.python != self.runtime.python:
            return has_nvidia_gpu()
        info = self.runtime.info()
        return info is not None and info.device == "gpu"

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    @property
    def stock(self) -> bool:
        """Whether the server is stock vLLM's (not the trainer's bundled one, which has its own
        log-probability default and policy versions)."""
        return self.entrypoint == STOCK_ENTRYPOINT

    def command(self) -> list[str]:
        return [str(self.python), *self.entrypoint, "--model", str(self.model_dir),
                "--served-model-name", self.served_name, "--host", "127.0.0.1", "--port", str(self.port),
                "--dtype", self.dtype.dtype, "--max-model-len", str(self.max_model_len),
                *(["--enforce-eager"] if self.enforce_eager else []), *(STOCK_RL_FLAGS if self.stock else ()),
                *self.extra_args]

    def environment(self) -> dict[str, str]:
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "VLLM_SERVER_DEV_MODE": "1",
               "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1", **self.environ}
        env.setdefault("VLLM_CACHE_ROOT", str(vllm_cache_dir()))
        if self.stock:
            env["PYTHONPATH"] = os.pathsep.join(filter(None, (str(PLUGINS_DIR), env.get("PYTHONPATH"))))
        if not self.gpu:
            cores = os.cpu_count() or 1
            # float32 halves the tokens a GiB of KV cache holds: 2 GiB keep the default job's
            # 64 sequences in memory at once
            env.setdefault("VLLM_CPU_KVCACHE_SPACE", "2" if self.dtype.dtype == "float32" else "1")
            env.setdefault("VLLM_CPU_OMP_THREADS_BIND", f"0-{cores - 1}")
            # the model runs in the engine core (vllm_plugins/atropos_engine_fork.py), which vLLM
            # would leave one thread to unless the number is given
            env.setdefault("OMP_NUM_THREADS", str(cores))
            if self.allocator != "system":
                env = with_fast_allocator(env, find_library())
        return env

    def start(self, timeout: float = 300.0) -> "LocalVLLM":
        """`launch` the server, then `wait_until_ready`."""
        self.launch()
        return self.wait_until_ready(timeout)

    def launch(self) -> None:
        """Start the server's process and return at once (`wait_until_ready` waits for it)."""
        if self.python == self.runtime.python and not self.python.exists():
            raise VLLMStartError(f"no vLLM runtime at {self.runtime.path}: run `atropos-vllm install`")
        if not self.python.exists():
            raise VLLMStartError(f"no python at {self.python}")
        if not (self.model_dir / "config.json").exists():
            raise VLLMStartError(f"{self.model_dir} is not a model folder: run `atropos-prepare-model`")
        if port_in_use(self.port):
            raise PortInUseError(f"port {self.port} is already in use by another process: stop it or choose "
                                 "another port (it is never stopped for you)")
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._stopped = False
        # started from another thread, the server would die when that thread ends
        in_main_thread = threading.current_thread() is threading.main_thread()
        environment = self.environment()
        if "VLLM_RPC_BASE_PATH" not in environment:
            self.ipc_folder = _private_ipc_folder()
            if self.ipc_folder is not None:
                environment["VLLM_RPC_BASE_PATH"] = str(self.ipc_folder)
        try:
            if self.forkserver is not None and self.forkserver.serves(self.python, self.entrypoint, environment):
                arguments = self.command()[1 + len(self.entrypoint):]
                self.process = self.forkserver.launch(arguments, environment, self.log_path)
                return
            with open(self.log_path, "ab") as log:
                self.process = subprocess.Popen(self.command(), stdout=log, stderr=subprocess.STDOUT,
                                                env=environment, start_new_session=True,
                                                preexec_fn=die_with_parent if in_main_thread else None)
        except BaseException:
            self._remove_ipc_folder()
            raise

    def wait_until_ready(self, timeout: float = 300.0) -> "LocalVLLM":
        """Wait until the launched server answers /health; one that fails to, or a wait that is
        interrupted, leaves nothing running."""
        try:
            self._wait_healthy(timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_healthy(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.process is not None
            if self.process.poll() is not None:
                raise VLLMStartError(
                    f"vLLM exited with code {self.process.returncode}; last log lines:\n{self.log_tail()}")
            try:
                if httpx.get(f"http://127.0.0.1:{self.port}/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        raise VLLMStartError(f"vLLM did not answer within {timeout:.0f} s; last log lines:\n{self.log_tail()}")

    def log_tail(self, lines: int = 25) -> str:
        """The server's last log lines (a forked server that never was: its fork server's)."""
        path = self.process.log_path if isinstance(self.process, ForkedServer) else self.log_path
        if not path.exists():
            return ""
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])

    def stop(self, grace: float = 20.0) -> None:
        """SIGTERM the server's process group, then SIGKILL what is left of it after `grace`
        seconds (or at once, when the group leader has already exited)."""
        if self.process is None or self._stopped:
            return
        if self.process.poll() is None:
            self._signal_group(signal.SIGTERM)
            try:
                self.process.wait(grace)
            except subprocess.TimeoutExpired:
                pass
        # whatever of the group outlived its leader (vLLM's engine process) goes too
        self._signal_group(signal.SIGKILL)
        self.process.wait()
        self._remove_ipc_folder()
        self._stopped = True

    def _signal_group(self, signum: int) -> None:
        assert self.process is not None
        if isinstance(self.process, ForkedServer):
            self.process.signal_group(signum)
            return
        signal_group(self.process.pid, signum)

    def _remove_ipc_folder(self) -> None:
        if self.ipc_folder is not None:
            shutil.rmtree(self.ipc_folder, ignore_errors=True)
            self.ipc_folder = None

    def reload_weights(self, weights_dir: Path, policy_version: Optional[int] = None, timeout: float = 300.0) -> float:
        """Swap the served weights for those in `weights_dir` (same architecture) without a
        restart, as a trainer does after each checkpoint; returns the seconds it took.

        Generation is paused, the weights are re-read, the prefix cache (built with the old
        weights) is dropped, the server's policy version becomes `policy_version` (default:
        one more than before) and generation resumes, even if the reload failed.
        """
        started = time.monotonic()
        root = f"http://127.0.0.1:{self.port}"
        with httpx.Client(timeout=timeout) as client:
            client.post(f"{root}/pause").raise_for_status()
            try:
                client.post(f"{root}/collective_rpc", json={  # `atropos_worker`: a tied LM head stays tied
                    "method": "reload_weights_keeping_ties",
                    "kwargs": {"weights_path": str(weights_dir)}}).raise_for_status()
                client.post(f"{root}/reset_prefix_cache").raise_for_status()
                if policy_version is None:
                    policy_version = int(client.get(f"{root}/atropos/policy_version").json()["policy_version"]) + 1
                client.post(f"{root}/atropos/policy_version",
                            json={"policy_version": policy_version}).raise_for_status()
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
    server = LocalVLLM(model_dir, port=args.port, served_name=args.served_name,
                       max_model_len=args.max_model_len, dtype=args.dtype)
    started = time.monotonic()
    print(f"starting vLLM on {model_dir}\n  dtype: {server.dtype.dtype} ({server.dtype.reason})\n"
          f"  log:   {server.log_path}", flush=True)
    try:
        with server:
            print(f"vLLM is up at {server.base_url} after {time.monotonic() - started:.1f} s. "
                  "Point environments at it with:")
            print("  " + " ".join(server.openai_flags()), flush=True)
            assert server.process is not None
            code = server.process.wait()
            raise VLLMStartError(f"vLLM exited with code {code}; last log lines:\n{server.log_tail()}")
    except KeyboardInterrupt as stop:
        print(f"{stop or 'interrupted'}: vLLM stopped", flush=True)


def _install(args: argparse.Namespace) -> None:
    runtime = Runtime(args.path)
    info = runtime.install(args.device)
    print(f"vLLM runtime ({info.device}) in {runtime.path}: {info.size_bytes / 1e9:.2f} GB, "
          f"installed in {info.install_seconds:.0f} s")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="atropos-vllm", description="Local vLLM inference for environments.",
                                     formatter_class=DefaultsHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    install_help = "Create the vLLM runtime (CPU build without an NVIDIA GPU)."
    install = commands.add_parser("install", help=install_help, description=install_help,
                                  formatter_class=DefaultsHelpFormatter)
    install.add_argument("--device", choices=["auto", "cpu", "gpu"], default="auto",
                         help="Build to install; auto: gpu when nvidia-smi lists a GPU, else cpu.")
    install.add_argument("--path", type=Path,
                         help="Runtime folder (default: $ATROPOS_VLLM_RUNTIME, else $ATROPOS_HOME/vllm-runtime).")
    serve_help = "Serve a model and print the --openai.* flags to use; stops on Ctrl-C, SIGTERM or SIGHUP."
    serve_description = (serve_help + " For RL, vLLM runs with --logprobs-mode processed_logprobs (each token's "
                         "log-probability under the distribution it was sampled from, after temperature, min-p, "
                         "top-k and top-p, as a trainer's importance ratio needs) and --generation-config vllm "
                         "(unset sampling fields take vLLM's neutral defaults); every answer carries the "
                         "X-Atropos-Policy-Version header.")
    serve = commands.add_parser("serve", help=serve_help, description=serve_description,
                                formatter_class=DefaultsHelpFormatter)
    serve.add_argument("--model", help="Model folder, GGUF file or hub name (default: the bundled SmolLM2).")
    serve.add_argument("--port", type=int, default=9001, help="Port on 127.0.0.1.")
    serve.add_argument("--served-name", default=DEFAULT_SERVED_NAME, help="Model name clients ask for.")
    serve.add_argument("--max-model-len", type=int, default=2048, help="Longest prompt + completion, in tokens.")
    serve.add_argument("--dtype", choices=DTYPES, default="auto",
                       help="Weights and compute dtype; auto: bfloat16 on CPUs with avx512_bf16 or amx_bf16, "
                            "float32 on other CPUs, the model's own on a GPU.")
    return parser


def main(argv: Optional[list[str]] = None) -> None:
    args = build_parser().parse_args(argv)
    try:
        with stop_signals_raise():
            (_install if args.command == "install" else _serve)(args)
    except (VLLMStartError, ModelPreparationError, subprocess.CalledProcessError, FileNotFoundError) as exc:
        sys.exit(f"error: {exc}")
    except KeyboardInterrupt as stop:
        sys.exit(f"{stop or 'interrupted'}")


if __name__ == "__main__":
    main()
