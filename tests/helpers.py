"""Starting real `run-api` processes on free loopback ports, and stopping them."""

from __future__ import annotations

import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Optional

import httpx

_CHOOSER = random.SystemRandom()  # not `random`, which a plugin may seed alike in every worker
_HANDED_OUT: set[int] = set()
_LOWEST = 20000
# A folder shared by the processes of one test run (the pytest-xdist workers and what their tests
# start), holding a file named after each port handed out: tests/conftest.py makes it.
PORT_CLAIMS_VARIABLE = "ATROPOS_TEST_PORT_CLAIMS"


def _ephemeral_start() -> int:
    """The first port of the range the kernel picks from for ``bind(0)`` and outgoing connections."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def _claim(port: int) -> bool:
    """Whether `port` is this caller's to use: handed out neither before in this process nor by
    another process of the test run (which left its claim in $ATROPOS_TEST_PORT_CLAIMS)."""
    if port in _HANDED_OUT:
        return False
    _HANDED_OUT.add(port)
    folder = os.environ.get(PORT_CLAIMS_VARIABLE)
    if not folder:
        return True
    try:
        os.close(os.open(os.path.join(folder, str(port)), os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return False
    except FileNotFoundError:  # a process that outlived its run: this process's own draws still hold
        pass
    return True


def free_port() -> int:
    """A loopback port nothing listens on, for a server a test starts: drawn at random below the
    kernel's ephemeral range, never twice in one test run. A port from ``bind(0)`` can be handed
    out again (to another worker's ``bind(0)``, or to a connection) before the server meant to use
    it starts: a two-rank trainer in a Slurm job binds its rendezvous a minute later on a loaded
    machine, and torch's TCPStore then shared the port with another test's rendezvous. Nor may two
    workers draw the same port: a two-rank trainer's rendezvous once found its port taken."""
    for _ in range(200):
        port = _CHOOSER.randrange(_LOWEST, _ephemeral_start())
        if not _claim(port):
            continue
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
        return port
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class ApiProcess:
    """A `run-api` child process; use as a context manager so it is always stopped. Its log is
    beside its state folder, in the test's temporary folder; without one, in a temporary file
    removed when the block ends."""

    def __init__(self, state_dir: Optional[Path], *extra_args: str, port: Optional[int] = None) -> None:
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.args = [sys.executable, "-m", "atroposlib.cli.run_api", "--port", str(self.port), *extra_args]
        if state_dir is not None:
            self.args += ["--state-dir", str(state_dir)]
        if state_dir is not None:
            self.log_path, self.owns_log = Path(state_dir).parent / f"run-api-{self.port}.log", False
        else:
            handle, name = tempfile.mkstemp(prefix=f"run-api-{self.port}-", suffix=".log")
            os.close(handle)
            self.log_path, self.owns_log = Path(name), True
        self.process: Optional[subprocess.Popen[bytes]] = None

    def start(self, timeout: float = 20.0) -> "ApiProcess":
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(self.args, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"run-api exited with {self.process.returncode}: {self.log()}")
            try:
                if httpx.get(self.url + "/health", timeout=1).status_code == 200:
                    return self
            except httpx.HTTPError:
                time.sleep(0.1)
        self.stop()
        raise TimeoutError(f"run-api did not answer within {timeout} s: {self.log()}")

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def kill9(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(10)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)

    def __enter__(self) -> "ApiProcess":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
        if self.owns_log:
            self.log_path.unlink(missing_ok=True)
