"""A warm start for the vLLM servers one run starts again and again: this process imports the
server program once, then forks each server from itself, so that a restart skips the import
of vLLM and torch (about 7 of 12 s to answer on a 2-core AMD EPYC).

    python atropos_forkserver.py --socket FD (--module MODULE | --script SCRIPT)

The requests and answers are JSON lines on the inherited stream socket FD:

    -> {"argv": [...], "env": {...}, "cwd": "...", "log": "..."}   start a server
    <- {"started": PID} or {"error": "..."}
    <- {"exited": PID, "code": CODE}    CODE < 0: ended by signal -CODE, as `subprocess` says

A server is what ``python -m MODULE ARGV...`` (or ``python SCRIPT ARGV...``) would run, in
`cwd`, with exactly `env` as its environment and its output appended to `log`. The import
happened under this process's own environment, so the launcher sends here only servers whose
environment matches it (`atroposlib.local.forkserver`). Each server runs in a session of its
own and gets SIGTERM when this process dies; this process exits when the socket closes.
Standard library only: it runs in vLLM's python, where atroposlib is not installed.
"""

from __future__ import annotations

import argparse
import json
import os
import runpy
import selectors
import signal
import socket
import sys
import time
import traceback
import warnings
from typing import Any, NoReturn

PRELOAD_NAME = "atropos_forkserver_preload"


def _die_with_parent() -> None:
    if sys.platform.startswith("linux"):
        import ctypes

        pr_set_pdeathsig = 1
        ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM)


def _search_path(entry: list[str], cwd: str) -> str:
    """What python puts first on ``sys.path`` for this entry point: the script's folder, or the
    working folder for ``-m``."""
    return cwd if entry[0] == "-m" else os.path.dirname(os.path.abspath(entry[0]))


def _run(entry: list[str], run_name: str) -> None:
    if entry[0] == "-m":
        runpy.run_module(entry[1], run_name=run_name, alter_sys=run_name == "__main__")
    else:
        runpy.run_path(entry[0], run_name=run_name)


def _prepare_process_titles() -> None:
    """vLLM names its processes (``VLLM::EngineCore``) with setproctitle, whose one-time set-up
    finds the memory to write titles in only while the environment is the one the process
    started with: done here, before any server replaces its environment."""
    try:
        import setproctitle
    except ImportError:
        return
    setproctitle.getproctitle()


def _name_process(entry: list[str], argv: list[str]) -> None:
    """Title the server with the command line it would have had, for ps and pkill."""
    try:
        import setproctitle
    except ImportError:
        return
    setproctitle.setproctitle(" ".join([sys.executable, *entry, *argv]))


def _exit_code(exc: SystemExit) -> int:
    if exc.code is None or isinstance(exc.code, int):
        return exc.code or 0
    print(exc.code, file=sys.stderr)
    return 1


def _become_server(entry: list[str], request: dict[str, Any], parent: int, keep_out: list[int]) -> NoReturn:
    """In the forked child: detach, take the request's output, environment, folder and arguments,
    and run the server program as ``__main__``; never returns to the fork server's loop."""
    code = 1
    try:
        os.setsid()
        _die_with_parent()
        if os.getppid() != parent:  # the fork server died before the line above took effect
            os._exit(1)
        signal.set_wakeup_fd(-1)
        for signum in (signal.SIGCHLD, signal.SIGTERM, signal.SIGHUP):
            signal.signal(signum, signal.SIG_DFL)
        # as a new python has it: Ctrl-C raises KeyboardInterrupt (unless the launcher ignored it)
        if signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:
            signal.signal(signal.SIGINT, signal.default_int_handler)
        for fd in keep_out:
            os.close(fd)
        log = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.close(log)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.close(null)
        os.environ.clear()
        os.environ.update(request["env"])
        os.chdir(request["cwd"])
        sys.argv = [entry[-1], *request["argv"]]
        sys.path[0] = _search_path(entry, request["cwd"])
        _name_process(entry, request["argv"])
        _run(entry, "__main__")
        code = 0
    except SystemExit as exc:
        code = _exit_code(exc)
    except BaseException:
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


class ForkServer:
    """The loop: start a server for each request, say when one exits, stop when the socket closes."""

    def __init__(self, channel: socket.socket, entry: list[str]) -> None:
        self.channel = channel
        self.entry = entry
        self.buffer = b""
        self.children: set[int] = set()
        self.wakeup_read, wakeup_write = os.pipe()
        os.set_blocking(self.wakeup_read, False)
        os.set_blocking(wakeup_write, False)
        signal.signal(signal.SIGCHLD, lambda signum, frame: None)
        signal.set_wakeup_fd(wakeup_write)
        self.keep_out = [channel.fileno(), self.wakeup_read, wakeup_write]

    def send(self, message: dict[str, Any]) -> None:
        try:
            self.channel.sendall(json.dumps(message).encode() + b"\n")
        except OSError:
            pass  # the launcher is gone: the loop ends on the closed socket

    def serve(self) -> None:
        with selectors.DefaultSelector() as selector:
            selector.register(self.channel, selectors.EVENT_READ)
            selector.register(self.wakeup_read, selectors.EVENT_READ)
            self.keep_out.append(selector.fileno())
            while True:
                for key, _ in selector.select():
                    if key.fileobj is self.channel and not self._read_requests():
                        return
                    if key.fd == self.wakeup_read:
                        self._reap()

    def _read_requests(self) -> bool:
        data = self.channel.recv(65536)
        if not data:
            return False
        self.buffer += data
        while b"\n" in self.buffer:
            line, self.buffer = self.buffer.split(b"\n", 1)
            self._start(json.loads(line))
        return True

    def _start(self, request: dict[str, Any]) -> None:
        sys.stdout.flush()
        sys.stderr.flush()
        try:
            pid = os.fork()
        except OSError as exc:
            self.send({"error": f"could not fork a server: {exc}"})
            return
        if pid == 0:
            _become_server(self.entry, request, os.getppid(), self.keep_out)
        self.children.add(pid)
        print(f"atropos fork server: forked server pid {pid}", flush=True)
        self.send({"started": pid})

    def _reap(self) -> None:
        try:
            while os.read(self.wakeup_read, 512):
                pass
        except BlockingIOError:
            pass
        for pid in list(self.children):
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                self.children.discard(pid)
                self.send({"exited": pid, "code": os.waitstatus_to_exitcode(status)})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--socket", type=int, required=True, help="the inherited socket's file descriptor")
    program = parser.add_mutually_exclusive_group(required=True)
    program.add_argument("--module", help="the server program, run as python -m MODULE")
    program.add_argument("--script", help="the server program, run as python SCRIPT")
    args = parser.parse_args()
    entry = ["-m", args.module] if args.module else [args.script]
    channel = socket.socket(fileno=args.socket)
    _die_with_parent()
    started = time.monotonic()
    sys.path[0] = _search_path(entry, os.getcwd())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # each server prints its own warnings as it runs the program
        _run(entry, PRELOAD_NAME)
    print(f"atropos fork server: imported {' '.join(entry)} in {time.monotonic() - started:.1f} s", flush=True)
    _prepare_process_titles()
    ForkServer(channel, entry).serve()


if __name__ == "__main__":
    main()
