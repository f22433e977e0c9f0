"""Stand-ins for the vLLM runtime and an environment, for tests of the local tools' process
handling that do not need the real engine.

`stand_in_runtime` makes a runtime folder whose ``bin/python`` runs this file as a fake
vLLM server: it answers ``/health`` and ``/metrics`` (generation counters that grow on
every read) on the ``--port`` it is given, starts a child process of its own (as vLLM starts
its engine), binds a Unix socket in ``$VLLM_RPC_BASE_PATH`` (where set) as vLLM's processes do,
and appends both process ids to ``$STAND_IN_PIDS``; with
``$STAND_IN_UNHEALTHY`` set, ``/health`` answers 503 for ever (a start that never ends).
Asked to run vLLM's fork server (`atroposlib.local.forkserver`), that python runs the real
one, on this file as the server program.
`stand_in_environment` writes an environment file that records its pid, writes the groups
asked for and prints process mode's report, or sleeps when ``$STAND_IN_ENV_SLEEPS`` is set.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import uuid
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Callable, Iterator

from atroposlib.local.forkserver import SCRIPT as FORKSERVER_SCRIPT
from atroposlib.local.runtime import MARKER, Runtime, packages_for

ENVIRONMENT = '''
import json, os, sys, time
from pathlib import Path

with open(os.environ["STAND_IN_PIDS"], "a") as pids:
    pids.write(f"{os.getpid()}\\n")
if os.environ.get("STAND_IN_ENV_SLEEPS"):
    time.sleep(600)
flags = dict(zip(sys.argv[2::2], sys.argv[3::2]))
out = Path(flags["--env.data_path_to_save_groups"])
size = int(flags["--env.group_size"])
groups = [{"tokens": [[1, 2]] * size, "scores": [1.0] + [-1.0] * (size - 1)} for _ in range(int(flags["--env.total_steps"]))]
out.write_text("".join(json.dumps(group) + "\\n" for group in groups))
print("config dump that the quickstart keeps in the log only")
print(f"wrote {len(groups)} groups to {out}")
print("1 generated group was not written:")
'''


def stand_in_runtime(folder: Path) -> Runtime:
    runtime = Runtime(folder / "runtime")
    runtime.python.parent.mkdir(parents=True)
    runtime.python.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{Path(__file__).resolve()}" "$@"\n')
    runtime.python.chmod(0o755)
    (runtime.path / MARKER).write_text(json.dumps({"device": "cpu", "packages": packages_for("cpu"),
                                                   "install_seconds": 0.0, "size_bytes": 0}))
    return runtime


def stand_in_environment(folder: Path) -> Path:
    path = folder / "stand_in_env.py"
    path.write_text(ENVIRONMENT)
    return path


def model_folder(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text("{}")
    return folder


def running(pid: int) -> bool:
    """Whether `pid` is a live process (zombies waiting to be reaped count as gone)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False
    return state not in ("Z", "X")


def parent_of(pid: int) -> int:
    """The parent process id of `pid`, from ``/proc/PID/stat``."""
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def wait_until(predicate: Callable[[], bool], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.1)


def recorded_pids(path: Path, count: int, timeout: float = 120.0) -> list[int]:
    """The process ids the stand-ins wrote to `path`, once there are `count` of them."""
    wait_until(lambda: path.exists() and len(path.read_text().split()) >= count, timeout)
    return [int(pid) for pid in path.read_text().split()]


def ipc_folder_of(pid: int) -> Path:
    """The folder of a (stand-in or real) vLLM process's IPC sockets, from its environment."""
    environment = dict(entry.split("=", 1) for entry in
                       Path(f"/proc/{pid}/environ").read_text().split("\0") if "=" in entry)
    return Path(environment["VLLM_RPC_BASE_PATH"])


def all_gone(pids: list[int], timeout: float = 10.0) -> None:
    wait_until(lambda: not any(running(pid) for pid in pids), timeout)


@contextmanager
def killed_at_exit(process: subprocess.Popen[str]) -> Iterator[subprocess.Popen[str]]:
    """The process, killed when the block ends if it still runs (a failed test leaves nothing)."""
    try:
        yield process
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def signal_and_read(process: subprocess.Popen[str], signum: int, timeout: float = 60.0) -> str:
    """Send `signum`, wait for the process to exit and return all it printed."""
    process.send_signal(signum)
    return process.communicate(timeout=timeout)[0]


class _Handler(BaseHTTPRequestHandler):
    reads = 0

    def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
        if self.path == "/metrics":
            _Handler.reads += 1
            body = (f'vllm:generation_tokens_total{{engine="0"}} {100.0 * _Handler.reads}\n'
                    f'vllm:request_generation_tokens_count{{engine="0"}} {2.0 * _Handler.reads}\n'
                    f'vllm:request_generation_tokens_sum{{engine="0"}} {100.0 * _Handler.reads}\n').encode()
        else:
            body = b""
        self.send_response(503 if self.path == "/health" and os.environ.get("STAND_IN_UNHEALTHY") else 200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


def _serve_as_vllm(argv: list[str]) -> None:
    port = int(argv[argv.index("--port") + 1])
    if os.environ.get("VLLM_RPC_BASE_PATH"):
        ipc = socket.socket(socket.AF_UNIX)
        ipc.bind(os.path.join(os.environ["VLLM_RPC_BASE_PATH"], str(uuid.uuid4())))
    engine = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    with open(os.environ["STAND_IN_PIDS"], "a") as pids:
        pids.write(f"{os.getpid()}\n{engine.pid}\n")
    print("stand-in vLLM:", " ".join(argv), flush=True)
    ThreadingHTTPServer(("127.0.0.1", port), _Handler).serve_forever()


def _fork_server_of_stand_ins(argv: list[str]) -> None:
    socket_fd = argv[argv.index("--socket") + 1]
    os.execv(sys.executable, [sys.executable, argv[0], "--socket", socket_fd, "--script", __file__])


if __name__ == "__main__":
    if len(sys.argv) > 1 and Path(sys.argv[1]).name == FORKSERVER_SCRIPT.name:
        _fork_server_of_stand_ins(sys.argv[1:])
    _serve_as_vllm(sys.argv[1:])
