"""Running model-written Python safely on this machine (grading it is `code_grading`).

`LocalSandbox.run_each(program, stdins)` runs a program once per input; `run(program, stdin)`
once. It needs neither Modal nor Docker. Each call starts one sandbox (a supervisor process
in fresh namespaces with a throwaway working directory); each input is then run by a
fresh process forked from the supervisor, which confines itself before any of the
program runs, and the supervisor reports how it ended: a `RunResult` (stdout, stderr, exit
code, and a `status` naming the limit that stopped it, if any). The runs' clocks start once the
supervisor says it is ready, so a slow start on a loaded machine costs no run its limits. Each
run gets:

=====================  =====================================================================
wall-clock timeout     `SandboxLimits.timeout` seconds (15) per run: then the run's whole
                       process group (it is a session of its own) is SIGKILLed (``timeout``)
CPU time               ``RLIMIT_CPU`` `cpu_seconds` (15): the kernel sends SIGXCPU at the limit,
                       which ends the process, and SIGKILLs one that ignores it a second later
                       (status ``cpu_limit``; told by the signal, not by measured CPU time, which
                       a loaded machine reports short)
memory                 ``RLIMIT_AS`` `memory_mb` (2048 MiB of address space): allocations fail,
                       Python raises MemoryError (status ``memory_limit``)
file size              ``RLIMIT_FSIZE`` `file_size_mb` (16 MiB per file): a larger write fails
                       with EFBIG "File too large" (status ``file_size_limit``)
processes              ``RLIMIT_NPROC`` `max_processes` (16, threads included), counted for the
                       sandbox's own user only: fork fails with EAGAIN (status
                       ``process_limit``)
open files             ``RLIMIT_NOFILE`` 128; no core dumps (``RLIMIT_CORE`` 0)
output                 stdout + stderr captured up to `max_output_mb` (32 MiB), then killed
                       (status ``output_limit``)
network                a new, empty network namespace (``unshare --net``: not even loopback is
                       up, connect fails with ENETUNREACH), plus a Python audit hook that refuses
                       non-Unix sockets and name look-ups (status ``network_refused``)
working directory      a throwaway directory, removed afterwards; with a mount namespace it
                       is a private tmpfs (`tmpfs_mb`, 64 MiB, noexec), and /tmp, /var/tmp and
                       /dev/shm are fresh private tmpfs too, so nothing written survives the run
writes elsewhere       refused: the code runs as an unprivileged uid when the caller is root
                       (kernel permission checks), and the audit hook refuses opening for
                       writing, creating, renaming or deleting anything outside the working
                       directory (status ``write_refused``)
other processes        each run's process group is SIGKILLed when it ends; a new PID namespace
                       (``unshare --pid --fork --kill-child``) makes the kernel kill whatever is
                       left when the sandbox ends; exec/spawn/system/Popen are refused by the
                       audit hook (fork is left to the process limit)
interpreter            ``python -I -B`` (isolated: no PYTHON* variables, no user site, no
                       current directory on sys.path, no bytecode writes), a clean environment
                       (PATH, a UTF-8 locale, HOME and TMPDIR = the working directory, one
                       BLAS/OpenMP thread), ctypes refused
=====================  =====================================================================

What applies depends on the machine: `LocalSandbox.protections` says. Namespaces need
``unshare`` (util-linux) and either root or unprivileged user namespaces; without them
the rlimits, the timeout, the process-group kill and the audit hook still apply, but
network and writes are refused only at the Python level, and fork is refused outright
(the process limit cannot be counted per run). When the caller is root the code runs as
a random unprivileged uid, so the interpreter must be readable by everyone: the running
one if it is, else the system ``python3`` (`LocalSandbox(python=...)` chooses).

The audit hook and the graders live in the same interpreter as the solution (as in
Atropos's LiveCodeBench-derived Modal grader): they keep honest code in bounds and report
clearly, but a solution that introspects its own process could fool the grade. The
kernel-level limits (rlimits, namespaces, uid, timeout) are what protect the machine.

Grading (`grade(code, tests, runner)`) follows Atropos's grader: test cases run in order and
grading stops at the first failure; results are ``True`` per passed case, or -2 (wrong
answer), -3 (time limit) or -4 (runtime error, any limit) for the failing one.

- ``fn_name`` "none" (or missing): stdin/stdout. The program reads the test's input and
  its output must match line by line after stripping; lines that differ must parse as
  numbers equal within 1e-4.
- ``fn_name`` set: call-based. Each input is JSON values one per line (the arguments),
  the output JSON; the function (a method of ``Solution()`` when the code defines that
  class) is called and its result (a tuple counts as a list) must equal the output.
- ``check`` set (HumanEval): the test code's ``check(<fn_name>)`` must not fail.

Solutions run with the names a LiveCodeBench grader provides (``string``, ``re``,
``collections``, ``heapq``, ``math``, ``itertools``, ``typing``, ... and their contents) and a
recursion limit of 50000. Each test case is its own sandboxed run.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Protocol

STATUSES = ("ok", "error", "timeout", "cpu_limit", "memory_limit", "file_size_limit", "process_limit",
            "output_limit", "network_refused", "write_refused", "process_refused", "ctypes_refused")
MARKER = "[sandbox]"
SUPERVISOR_START_TIMEOUT = 120.0  # seconds for a supervisor to say it is ready
READY = b'{"ready": true}'  # the supervisor's first line
ANSWER_MARGIN = 30.0  # seconds past a run's timeout for the supervisor to answer, else the sandbox failed
# Modules the supervisor imports once, so that each run (a fork) starts with them loaded.
PRELOAD = ["string", "re", "datetime", "collections", "heapq", "bisect", "copy", "math", "random", "statistics",
           "itertools", "functools", "operator", "io", "json", "typing", "decimal", "fractions", "traceback"]


@dataclass
class SandboxLimits:
    """What one run may use (see the module docstring)."""

    timeout: float = 15.0
    cpu_seconds: int = 15
    memory_mb: int = 2048
    file_size_mb: int = 16
    max_processes: int = 16
    max_open_files: int = 128
    max_output_mb: int = 32
    tmpfs_mb: int = 64


@dataclass
class RunResult:
    """How one run ended. `status` is "ok" only for a clean exit 0 within every limit."""

    stdout: str
    stderr: str
    returncode: Optional[int]
    status: str
    duration: float
    refusals: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.status == "ok"


class ProgramRunner(Protocol):
    """Anything that runs a Python program on given stdins (the local sandbox, a remote executor)."""

    async def run(self, program: str, stdin: str = "") -> RunResult: ...

    async def run_each(self, program: str, stdins: list[str],
                       keep_going: Optional[Callable[[int, "RunResult"], bool]] = None) -> list["RunResult"]: ...


# --------------------------------------------------------------------------------------------------
# The supervisor: passed to ``python -I -B -c``, its one argument a JSON object of settings. It runs
# as root (real, or of its user namespace), sets up the mounts, then reads one JSON request per line
# on stdin ({"stdin": "..."}) and for each forks a child that confines itself (rlimits, uid, audit
# hook) and runs main.py on that input; it enforces the wall clock and the output cap, and answers
# with one JSON line per request. It stays unconfined and never runs the solution itself.
RUNNER = r"""
import json, os, resource, selectors, signal, sys, time
cfg = json.loads(sys.argv[1])
work = cfg["work"]
files = {}
for name in os.listdir(work):
    with open(os.path.join(work, name), "rb") as handle:
        files[name] = handle.read()
if cfg["mount"]:
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]
    def _tmpfs(target, mode):
        options = ("size=%dm,mode=%s" % (cfg["tmpfs_mb"], mode)).encode()
        libc.mount(b"tmpfs", target.encode(), b"tmpfs", 2 | 4 | 8, options)  # nosuid, nodev, noexec
    for shared in ("/tmp", "/var/tmp", "/dev/shm"):
        if os.path.isdir(shared):
            _tmpfs(shared, "1777")
    os.makedirs(work, exist_ok=True)
    _tmpfs(work, "700")
    del libc, ctypes, _tmpfs
    for name, data in files.items():
        if not os.path.exists(os.path.join(work, name)):
            with open(os.path.join(work, name), "wb") as handle:
                handle.write(data)
uid = cfg["uid"]
if uid is not None:
    for name in [""] + list(files):
        os.chown(os.path.join(work, name), uid, uid)
os.chdir(work)
program = compile(files["main.py"].decode("utf-8"), "main.py", "exec")
for module in cfg["preload"]:
    try:
        __import__(module)
    except Exception:
        pass
import errno, io, socket, traceback


def _confine_and_run():
    # In the forked child: confine this process for good, then run the program. Never returns.
    sys.stdin = sys.__stdin__ = open(0, "r", encoding="utf-8", errors="surrogateescape", closefd=False)
    sys.stdout = sys.__stdout__ = open(1, "w", encoding="utf-8", errors="surrogateescape", closefd=False)
    sys.stderr = sys.__stderr__ = open(2, "w", encoding="utf-8", errors="backslashreplace", closefd=False)

    def _limit(kind, value):
        resource.setrlimit(kind, (value, value))
    _limit(resource.RLIMIT_CORE, 0)
    # SIGXCPU at the soft limit names the cause by itself; the hard limit kills a program that ignores it
    resource.setrlimit(resource.RLIMIT_CPU, (cfg["cpu"], cfg["cpu"] + 1))
    _limit(resource.RLIMIT_FSIZE, cfg["fsize"])
    _limit(resource.RLIMIT_NOFILE, cfg["nofile"])
    if cfg["nproc"]:
        _limit(resource.RLIMIT_NPROC, cfg["nproc"])
    if uid is not None:
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)
    os.umask(0o077)
    _limit(resource.RLIMIT_AS, cfg["memory"])
    sys.setrecursionlimit(50000)
    home = os.path.realpath(work)
    first_pid = os.getpid()
    write_flags = os.O_WRONLY | os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_TRUNC
    path_events = {"os.remove": (0,), "os.rmdir": (0,), "os.mkdir": (0,), "os.chmod": (0,), "os.chown": (0,),
                   "os.truncate": (0,), "os.utime": (0,), "os.chflags": (0,), "os.lchflags": (0,),
                   "os.mkfifo": (0,), "os.mknod": (0,), "os.rename": (0, 1), "os.link": (0, 1),
                   "os.symlink": (1,), "shutil.rmtree": (0,), "os.setxattr": (0,), "os.removexattr": (0,)}
    spawn_events = {"os.exec", "os.posix_spawn", "os.spawn", "os.system", "subprocess.Popen", "os.forkpty",
                    "pty.spawn", "os.startfile"}
    if not cfg["nproc"]:
        spawn_events.add("os.fork")
    net_events = {"socket.getaddrinfo", "socket.gethostbyname", "socket.gethostbyaddr",
                  "socket.gethostbyname_ex", "socket.connect", "socket.bind", "socket.sendto", "socket.sendmsg"}
    native_events = {"ctypes.dlsym", "ctypes.dlsym/handle", "ctypes.call_function", "ctypes.cdata"}

    def say(text):
        try:
            os.write(2, ("\n%s %s\n" % (MARKER, text)).encode())
        except OSError:
            pass

    def inside(path):
        if isinstance(path, int):
            return True
        path = os.fsdecode(path)
        if path == "/dev/null":
            return True
        full = os.path.realpath(os.path.join(os.getcwd(), path))
        return full == home or full.startswith(home + os.sep)

    def refuse(kind, what):
        say("refused: %s (%s)" % (kind, what))
        raise PermissionError(errno.EACCES, "the sandbox refuses %s" % kind, str(what))

    def guard(event, args):
        if event == "open":
            path, mode, flags = args
            writing = bool(mode) and any(c in mode for c in "wax+")
            if (writing or (isinstance(flags, int) and flags & write_flags)) and not inside(path):
                refuse("write", path)
        elif event in path_events:
            for index in path_events[event]:
                if index < len(args) and args[index] is not None and not inside(args[index]):
                    refuse("write", args[index])
        elif event == "socket.__new__":
            if args[1] not in (socket.AF_UNIX, -1):
                refuse("network", "socket")
        elif event in net_events:
            refuse("network", event)
        elif event in spawn_events:
            refuse("process", event)
        elif event in native_events or (event == "ctypes.dlopen" and args and args[0] is not None):
            refuse("ctypes", event)

    if cfg["guards"]:
        sys.addaudithook(guard)
    real_fork = os.fork

    def fork():
        try:
            return real_fork()
        except BlockingIOError:
            say("limit: processes")
            raise
    os.fork = fork

    def finish(code):
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:
                pass
        os._exit(code)

    scope = {"__name__": "__main__", "__file__": os.path.join(work, "main.py"), "__builtins__": __builtins__}
    try:
        exec(program, scope)
    except SystemExit as ended:
        finish(ended.code if isinstance(ended.code, int) else (0 if ended.code is None else 1))
    except BaseException as error:
        try:
            traceback.print_exc()
        except BaseException:
            pass
        if isinstance(error, MemoryError):
            say("limit: memory")
        elif isinstance(error, OSError) and error.errno == errno.EFBIG:
            say("limit: file size")
        elif isinstance(error, socket.gaierror) or (
                isinstance(error, OSError) and error.errno in (errno.ENETUNREACH, errno.EHOSTUNREACH)):
            say("refused: network (unreachable)")
        finish(1)
    finish(0)


def _kill(pgid):
    try:
        os.killpg(pgid, signal.SIGKILL)
    except OSError:
        pass


def _reap():
    while True:
        try:
            if os.waitpid(-1, os.WNOHANG)[0] == 0:
                return
        except ChildProcessError:
            return


def _one(data):
    in_r, in_w = os.pipe()
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    started = time.monotonic()
    pid = os.fork()
    if pid == 0:
        try:
            os.setsid()
            os.dup2(in_r, 0)
            os.dup2(out_w, 1)
            os.dup2(err_w, 2)
            os.closerange(3, 1 << 16)
            _confine_and_run()
        finally:
            os._exit(127)
    for fd in (in_r, out_w, err_w):
        os.close(fd)
    for fd in (in_w, out_r, err_r):
        os.set_blocking(fd, False)
    chunks = {out_r: [], err_r: []}
    kept = 0
    written = 0
    timed_out = overflow = False
    how = usage = None
    selector = selectors.DefaultSelector()
    selector.register(out_r, selectors.EVENT_READ)
    selector.register(err_r, selectors.EVENT_READ)
    if data:
        selector.register(in_w, selectors.EVENT_WRITE)
    else:
        os.close(in_w)
    deadline = started + cfg["timeout"]
    exited_at = None
    while selector.get_map():
        now = time.monotonic()
        if now >= deadline:
            timed_out = True
            break
        if exited_at is not None and now - exited_at > 1.0:
            break  # its descendants keep the pipes open: they were killed, stop waiting
        for key, _ in selector.select(min(deadline - now, 0.05)):
            fd = key.fd
            if fd == in_w:
                try:
                    written += os.write(in_w, data[written:written + 65536])
                except (BrokenPipeError, OSError):
                    written = len(data)
                if written >= len(data):
                    selector.unregister(in_w)
                    os.close(in_w)
                continue
            try:
                chunk = os.read(fd, 65536)
            except BlockingIOError:
                continue
            if not chunk:
                selector.unregister(fd)
                continue
            if kept + len(chunk) > cfg["output"]:
                overflow = True
                break
            chunks[fd].append(chunk)
            kept += len(chunk)
        if overflow:
            break
        if how is None:
            done, how_now, usage_now = os.wait4(pid, os.WNOHANG)
            if done:
                how, usage, exited_at = how_now, usage_now, time.monotonic()
                _kill(pid)
    _kill(pid)
    if how is None:
        _, how, usage = os.wait4(pid, 0)
    _kill(pid)
    _reap()
    for fd in list(selector.get_map()):
        selector.unregister(fd)
    selector.close()
    for fd in (in_w, out_r, err_r):
        try:
            os.close(fd)
        except OSError:
            pass
    cpu = usage.ru_utime + usage.ru_stime
    signalled = os.WTERMSIG(how) if os.WIFSIGNALED(how) else None
    return {
        "stdout": b"".join(chunks[out_r]).decode("utf-8", "replace"),
        "stderr": b"".join(chunks[err_r]).decode("utf-8", "replace"),
        "returncode": os.waitstatus_to_exitcode(how), "timed_out": timed_out, "overflow": overflow,
        "cpu_limit": not timed_out and not overflow and (
            signalled == signal.SIGXCPU or (signalled == signal.SIGKILL and cpu >= cfg["cpu"])),
        "duration": time.monotonic() - started,
    }


requests = os.fdopen(0, "rb", closefd=False)
answers = os.fdopen(1, "wb", closefd=False)
answers.write(READY + b"\n")
answers.flush()
for line in requests:
    request = json.loads(line)
    answer = _one(request["stdin"].encode("utf-8", "surrogateescape"))
    answers.write(json.dumps(answer).encode() + b"\n")
    answers.flush()
""".replace("MARKER", repr(MARKER)).replace("READY", repr(READY))


def _reachable_by_others(path: str) -> bool:
    """Whether a user with no special rights can reach (and read) `path`."""
    path = os.path.realpath(path)
    try:
        if not os.stat(path).st_mode & stat.S_IROTH:
            return False
        parent = os.path.dirname(path)
        while True:
            if not os.stat(parent).st_mode & stat.S_IXOTH:
                return False
            if parent == "/":
                return True
            parent = os.path.dirname(parent)
    except OSError:
        return False


def _interpreter_for_others() -> str:
    """An interpreter an unprivileged uid can run: this one if its files are readable, else python3."""
    own_stdlib = os.path.join(sys.base_prefix, "lib", f"python{sys.version_info[0]}.{sys.version_info[1]}", "os.py")
    if _reachable_by_others(sys.executable) and _reachable_by_others(own_stdlib) and (
            sys.prefix == sys.base_prefix or _reachable_by_others(os.path.join(sys.prefix, "pyvenv.cfg"))):
        return sys.executable
    for candidate in (shutil.which("python3", path="/usr/local/bin:/usr/bin:/bin"), "/usr/bin/python3"):
        if candidate and _reachable_by_others(candidate):
            return candidate
    raise RuntimeError("running as root, the sandbox needs a python3 that every user can read: "
                       "pass LocalSandbox(python=...) / --env.sandbox_python")


_NAMESPACE_PREFIX: Optional[list[str]] = None


def namespace_prefix() -> list[str]:
    """The ``unshare`` command line this machine allows (probed once), or [] when none works."""
    global _NAMESPACE_PREFIX
    if _NAMESPACE_PREFIX is None:
        _NAMESPACE_PREFIX = []
        unshare = shutil.which("unshare")
        if unshare:
            user = [] if os.geteuid() == 0 else ["--map-root-user"]
            full = [unshare, *user, "--net", "--pid", "--fork", "--kill-child", "--mount", "--propagation", "private"]
            for prefix in (full, [unshare, *user, "--net", "--pid", "--fork", "--kill-child"], [unshare, *user, "--net"]):
                try:
                    probe = subprocess.run([*prefix, "true"], capture_output=True, timeout=20)
                except (OSError, subprocess.TimeoutExpired):
                    continue
                if probe.returncode == 0:
                    _NAMESPACE_PREFIX = prefix
                    break
    return list(_NAMESPACE_PREFIX)


class LocalSandbox:
    """Runs programs in confined processes on this machine (see the module docstring).

    `isolation`: "auto" (namespaces when ``unshare`` works here), or "none" (rlimits, timeout
    and the audit hook only). `concurrency` bounds simultaneous runs (default: CPU count).
    """

    def __init__(self, limits: Optional[SandboxLimits] = None, python: Optional[str] = None,
                 isolation: str = "auto", concurrency: Optional[int] = None, python_guards: bool = True) -> None:
        if isolation not in ("auto", "none"):
            raise ValueError("isolation must be 'auto' or 'none'")
        self.limits = limits or SandboxLimits()
        self.prefix = namespace_prefix() if isolation == "auto" else []
        self.as_root = os.geteuid() == 0
        self.python = python or (_interpreter_for_others() if self.as_root else sys.executable)
        self.concurrency = concurrency or os.cpu_count() or 1
        self.python_guards = python_guards
        self._slots: Optional[asyncio.Semaphore] = None
        self._slots_loop: Any = None

    @property
    def has_pid_namespace(self) -> bool:
        return "--pid" in self.prefix

    @property
    def counts_processes(self) -> bool:
        """RLIMIT_NPROC is only per run for a uid of its own (root) or a user namespace of its own."""
        return self.as_root or "--map-root-user" in self.prefix

    @property
    def protections(self) -> dict[str, str]:
        """What confines a run on this machine, in words."""
        net = "network namespace (unshare --net) + audit hook" if "--net" in self.prefix else "audit hook only"
        mounts = "--mount" in self.prefix
        writes = ("private tmpfs work dir, /tmp, /var/tmp, /dev/shm (mount namespace)" if mounts
                  else "throwaway directory on disk")
        writes += "; unprivileged uid" if self.as_root else "; caller's uid"
        writes += " + audit hook"
        procs = (f"RLIMIT_NPROC {self.limits.max_processes}" if self.counts_processes
                 else "fork refused by the audit hook")
        procs += ("; PID namespace kills leftovers" if self.has_pid_namespace else "; process group killed")
        return {"network": net, "filesystem": writes, "processes": procs, "interpreter": f"{self.python} -I -B"}

    def _semaphore(self) -> asyncio.Semaphore:
        loop = asyncio.get_running_loop()
        if self._slots is None or self._slots_loop is not loop:  # a semaphore belongs to one event loop
            self._slots = asyncio.Semaphore(self.concurrency)
            self._slots_loop = loop
        return self._slots

    async def run(self, program: str, stdin: str = "") -> RunResult:
        """Run `program` (Python source) with `stdin`; never raises for anything the program does."""
        return (await self.run_each(program, [stdin]))[0]

    async def run_each(self, program: str, stdins: list[str],
                       keep_going: Optional[Callable[[int, RunResult], bool]] = None) -> list[RunResult]:
        """Run `program` once per stdin, each run a fresh confined process, all in one sandbox (one
        set of namespaces, one throwaway directory). After each run ``keep_going(index, result)``
        decides whether to run the next. Returns the results of the runs made."""
        async with self._semaphore():
            return await self._session(program, stdins, keep_going)

    def _settings(self, work: str, uid: Optional[int]) -> dict[str, Any]:
        limits = self.limits
        return {
            "work": work, "uid": uid, "mount": "--mount" in self.prefix, "tmpfs_mb": limits.tmpfs_mb,
            "cpu": max(1, int(limits.cpu_seconds)), "memory": limits.memory_mb * 1024 * 1024,
            "fsize": limits.file_size_mb * 1024 * 1024, "nofile": limits.max_open_files,
            "nproc": limits.max_processes if self.counts_processes else 0, "guards": self.python_guards,
            "timeout": limits.timeout, "output": limits.max_output_mb * 1024 * 1024, "preload": PRELOAD,
        }

    async def _session(self, program: str, stdins: list[str],
                       keep_going: Optional[Callable[[int, RunResult], bool]]) -> list[RunResult]:
        work = tempfile.mkdtemp(prefix="atropos-sandbox-")
        uid = random.randrange(100_000, 160_000) if self.as_root else None
        proc = None
        results: list[RunResult] = []
        try:
            with open(os.path.join(work, "main.py"), "w", encoding="utf-8") as handle:
                handle.write(program)
            if uid is not None:
                os.chown(work, uid, uid)
                os.chown(os.path.join(work, "main.py"), uid, uid)
            env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8", "HOME": work, "TMPDIR": work,
                   "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
            command = [*self.prefix, self.python, "-I", "-B", "-c", RUNNER, json.dumps(self._settings(work, uid))]
            cap = self.limits.max_output_mb * 1024 * 1024
            proc = await asyncio.create_subprocess_exec(
                *command, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE, cwd=work, env=env, start_new_session=True, limit=4 * cap + (1 << 20))
            complaints = bytearray()

            async def collect_stderr() -> None:
                while chunk := await proc.stderr.read(65536):
                    if len(complaints) < 65536:
                        complaints.extend(chunk)

            stderr_task = asyncio.ensure_future(collect_stderr())
            failed_start = await self._started(proc, complaints)
            if failed_start is not None:
                return [failed_start]
            for index, stdin in enumerate(stdins):
                result = await self._ask(proc, stdin, complaints)
                results.append(result)
                if result.status == "error" and result.returncode is None:
                    break  # the supervisor itself failed
                if keep_going is not None and not keep_going(index, result):
                    break
            proc.stdin.close()
            try:
                await asyncio.wait_for(proc.wait(), 10)
            except asyncio.TimeoutError:
                pass
            _kill_group(proc.pid)
            await proc.wait()
            await asyncio.wait_for(stderr_task, 10)
            return results
        finally:
            if proc is not None and proc.returncode is None:
                _kill_group(proc.pid)
                await proc.wait()
            shutil.rmtree(work, ignore_errors=True)

    async def _started(self, proc: Any, complaints: bytearray) -> Optional[RunResult]:
        """None once the supervisor says it is ready, else the failed run that says why.

        Its start (an interpreter, the namespaces, the preloaded modules) can take many seconds
        on a loaded machine: it is waited for apart from the runs, so that no run's time limit
        or answer deadline is spent on it."""
        started = time.monotonic()
        try:
            line = await asyncio.wait_for(proc.stdout.readline(), SUPERVISOR_START_TIMEOUT)
            problem = "it ended" if not line else f"it said {line[:200]!r}"
        except (asyncio.TimeoutError, ValueError, OSError, asyncio.LimitOverrunError) as exc:
            line, problem = b"", repr(exc)
        if line.strip() == READY:
            return None
        return await _sandbox_failed(proc, complaints, f"the sandbox did not start ({problem})", started)

    async def _ask(self, proc: Any, stdin: str, complaints: bytearray) -> RunResult:
        """One run: a request to the supervisor, its answer as a RunResult."""
        started = time.monotonic()
        try:
            proc.stdin.write(json.dumps({"stdin": stdin}).encode() + b"\n")
            await proc.stdin.drain()
            line = await asyncio.wait_for(proc.stdout.readline(), self.limits.timeout + ANSWER_MARGIN)
            answer = json.loads(line)
        except (asyncio.TimeoutError, ValueError, OSError, asyncio.LimitOverrunError) as exc:
            return await _sandbox_failed(proc, complaints, f"the sandbox failed ({exc!r})", started)
        stderr = answer["stderr"]
        status = _status(answer["returncode"], stderr, answer["timed_out"], answer["overflow"], answer["cpu_limit"])
        return RunResult(answer["stdout"], stderr, answer["returncode"], status, answer["duration"], _refusals(stderr))


async def _sandbox_failed(proc: Any, complaints: bytearray, what: str, started: float) -> RunResult:
    """Ends a supervisor that failed; the run that says `what` went wrong, with its complaints."""
    _kill_group(proc.pid)
    await asyncio.sleep(0.05)
    detail = bytes(complaints).decode("utf-8", "replace")
    return RunResult("", f"{what}: {detail}", None, "error", time.monotonic() - started)


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _refusals(stderr: str) -> list[str]:
    found = []
    for line in stderr.splitlines():
        if line.startswith(MARKER + " "):
            found.append(line[len(MARKER) + 1:])
    return found


def _status(returncode: Optional[int], stderr: str, timed_out: bool, overflow: bool, cpu_limit: bool) -> str:
    if timed_out:
        return "timeout"
    if overflow:
        return "output_limit"
    if cpu_limit:
        return "cpu_limit"
    notes = " ".join(_refusals(stderr))
    for needle, status in (("limit: memory", "memory_limit"), ("limit: file size", "file_size_limit"),
                           ("limit: processes", "process_limit"), ("refused: network", "network_refused"),
                           ("refused: write", "write_refused"), ("refused: process", "process_refused"),
                           ("refused: ctypes", "ctypes_refused")):
        if needle in notes:
            return status
    if returncode == 0:
        return "ok"
    if "MemoryError" in stderr:
        return "memory_limit"
    return "error"
