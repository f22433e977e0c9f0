"""A warm start for a vLLM server that is started again and again, as a trainer restarts its
vLLM on each checkpoint: `ForkServer` runs ``vllm_plugins/atropos_forkserver.py`` in vLLM's
python, which imports the server program once and forks each server from itself, so that every
start after the first skips the import of vLLM and torch (`bench/vllm_start.py`). `ForkedServer`
is one such server, with the part of `subprocess.Popen`'s interface `LocalVLLM` uses.

The program was imported under the fork server's environment, which a forked server cannot
change where it counts (a preloaded allocator, OpenMP's settings, the python path): a fork
server `serves` only launches whose environment is its own but for the variables each launch
sets itself (`PER_LAUNCH_VARIABLES`). Each server runs in a session of its own, as a launched
one does; the fork server ends with the process that started it, and its servers with it.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import threading
import time
from collections import deque
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence

from atroposlib.local.signals import die_with_parent, signal_group

SCRIPT = Path(__file__).resolve().with_name("vllm_plugins") / "atropos_forkserver.py"
# read by vLLM when the server starts, not when it is imported
PER_LAUNCH_VARIABLES = frozenset({"VLLM_RPC_BASE_PATH"})
# seconds a fork server that closed its end of the requests gets to exit before it is killed
EXIT_GRACE = 10.0


def _shared(environment: Mapping[str, str]) -> dict[str, str]:
    return {name: value for name, value in environment.items() if name not in PER_LAUNCH_VARIABLES}


def _alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie no parent reaps does not)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True
    return state not in ("Z", "X")


class ForkedServer:
    """One server a `ForkServer` started: its pid is known once the fork server has imported
    the program and forked it; `returncode` once it has exited."""

    def __init__(self, owner: "ForkServer", argv: Sequence[str], log_path: Path) -> None:
        self.owner = owner
        self.args = list(argv)
        self.server_log = Path(log_path)
        self.pid: Optional[int] = None
        self.returncode: Optional[int] = None
        self._ended = threading.Event()
        self._orphaned = False

    @property
    def log_path(self) -> Path:
        """Where its output is: the fork server's log until it was forked (a failed import is
        there), then its own."""
        return self.owner.log_path if self.pid is None else self.server_log

    def _end(self, code: int) -> None:
        self.returncode = code
        self._ended.set()

    def _orphan(self) -> None:
        """Its fork server is gone, and with it the exit code: from now on it is watched by pid."""
        self._orphaned = True

    def poll(self) -> Optional[int]:
        if self._orphaned and not self._ended.is_set() and (self.pid is None or not _alive(self.pid)):
            self._end(-signal.SIGTERM)  # what its fork server's death sent it
        return self.returncode

    def wait(self, timeout: Optional[float] = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise subprocess.TimeoutExpired(self.args, timeout or 0.0)
            self._ended.wait(0.2 if left is None else min(left, 0.2))
        assert self.returncode is not None
        return self.returncode

    def signal_group(self, signum: int) -> None:
        """Send `signum` to the server's process group; before it is forked, end the fork server
        instead, which takes the server with it."""
        if self.pid is None:
            if self.poll() is None:
                self.owner.kill()
            return
        signal_group(self.pid, signum)


class ForkServer:
    """A process that has imported one server program (`python` ``*entrypoint``, as `LocalVLLM`
    names them) under `environment`, and forks servers of it on request; started by the first
    `launch`, ended by `close` (or a context manager's exit)."""

    def __init__(self, python: Path, entrypoint: Sequence[str], environment: Mapping[str, str],
                 log_path: Path) -> None:
        self.python = Path(python)
        self.entrypoint = tuple(entrypoint)
        self.environment = _shared(environment)
        self.log_path = Path(log_path)
        self.process: Optional[subprocess.Popen[bytes]] = None
        self._channel: Optional[socket.socket] = None
        self._reader: Optional[threading.Thread] = None
        self._lock = threading.Lock()
        self._pending: deque[ForkedServer] = deque()  # asked for, not yet forked: answers come in order
        self._servers: dict[int, ForkedServer] = {}

    def serves(self, python: Path, entrypoint: Sequence[str], environment: Mapping[str, str]) -> bool:
        """Whether a server of `python` ``*entrypoint`` in `environment` can be forked from here."""
        return (Path(python) == self.python and tuple(entrypoint) == self.entrypoint
                and _shared(environment) == self.environment
                and (self.process is None or self.process.poll() is None))

    def _program(self) -> list[str]:
        if self.entrypoint[0] == "-m":
            return ["--module", self.entrypoint[1]]
        return ["--script", self.entrypoint[0]]

    def _start(self) -> None:
        ours, theirs = socket.socketpair()
        in_main_thread = threading.current_thread() is threading.main_thread()
        try:
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
            with open(self.log_path, "ab") as log:
                self.process = subprocess.Popen(
                    [str(self.python), str(SCRIPT), "--socket", str(theirs.fileno()), *self._program()],
                    stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=self.environment,
                    pass_fds=(theirs.fileno(),), start_new_session=True,
                    preexec_fn=die_with_parent if in_main_thread else None)
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        self._channel = ours
        self._reader = threading.Thread(target=self._read_answers, name="fork-server-answers", daemon=True)
        self._reader.start()

    def launch(self, argv: Sequence[str], environment: Mapping[str, str], log_path: Path) -> ForkedServer:
        """Ask for a server run with `argv` and `environment`, its output appended to `log_path`,
        and return at once (the first launch waits nowhere for the import either). Asked of a fork
        server that has ended (a failed import), the server has ended too, with its exit code."""
        if self.process is None:
            self._start()
        assert self._channel is not None
        server = ForkedServer(self, argv, log_path)
        request = {"argv": list(argv), "env": dict(environment), "cwd": os.getcwd(), "log": str(log_path)}
        with self._lock:
            try:
                self._channel.sendall(json.dumps(request).encode() + b"\n")
            except OSError:
                server._end(self._exit_code())
            else:
                self._pending.append(server)
        return server

    def _exit_code(self) -> int:
        """The exit code of a fork server that stopped reading (its import failed, or it was killed),
        which the servers asked of it share (1 when it has none)."""
        assert self.process is not None
        try:
            return self.process.wait(EXIT_GRACE) or 1
        except subprocess.TimeoutExpired:
            self.kill()
            return self.process.wait() or 1

    def _read_answers(self) -> None:
        assert self._channel is not None
        try:
            for line in self._channel.makefile("rb"):
                self._answer(json.loads(line))
        except OSError:
            pass  # killed with a request unread: the same end
        assert self.process is not None
        code = self.process.wait()
        with self._lock:
            while self._pending:
                self._pending.popleft()._end(code or 1)
            for server in self._servers.values():
                server._orphan()
            self._servers.clear()

    def _answer(self, answer: dict[str, Any]) -> None:
        with self._lock:
            if "started" in answer:
                server = self._pending.popleft()
                server.pid = int(answer["started"])
                self._servers[server.pid] = server
            elif "error" in answer:
                print(f"vLLM fork server: {answer['error']}", flush=True)
                self._pending.popleft()._end(1)
            elif "exited" in answer:
                exited = self._servers.pop(int(answer["exited"]), None)
                if exited is not None:
                    exited._end(int(answer["code"]))

    def kill(self) -> None:
        """End the fork server at once; servers it forked get SIGTERM."""
        if self.process is not None and self.process.poll() is None:
            signal_group(self.process.pid, signal.SIGKILL)
            self.process.wait()

    def close(self, grace: float = 10.0) -> None:
        """Let the fork server exit (servers still running get SIGTERM) and wait for it."""
        if self._channel is not None:
            try:  # the reader still holds the socket open: the fork server sees the end of its requests
                self._channel.shutdown(socket.SHUT_WR)
            except OSError:
                pass
        if self.process is not None:
            try:
                self.process.wait(grace)
            except subprocess.TimeoutExpired:
                self.kill()
        if self._reader is not None:
            self._reader.join(grace)
        if self._channel is not None:
            self._channel.close()
            self._channel = None

    def __enter__(self) -> "ForkServer":
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()
