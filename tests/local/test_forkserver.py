"""vLLM's fork server with a stand-in server program: one import for every server, each with its
own arguments, environment, folder and log; exit codes, a failed import and stops that reach the
launcher; a launch in another environment started the usual way; and no process left behind
when the fork server, or the process that started it, ends."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest

from atroposlib.local.forkserver import ForkedServer, ForkServer
from atroposlib.local.vllm_service import LocalVLLM, VLLMStartError
from tests.helpers import free_port
from tests.local.stand_ins import all_gone, killed_at_exit, model_folder, running, wait_until

# what the server program imports, once, in the fork server (`$HEAVY_SECONDS` makes it slow)
HEAVY = """
import os, time
time.sleep(float(os.environ.get("HEAVY_SECONDS", "0")))
with open(os.environ["IMPORTS"], "a") as imports:
    imports.write(f"{os.getpid()}\\n")
"""
PROGRAM = """
import json, os, signal, sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import heavy_part


class Health(BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass


if __name__ == "__main__":
    def flag(name):
        return sys.argv[sys.argv.index(name) + 1] if name in sys.argv else None

    print(json.dumps({"pid": os.getpid(), "ppid": os.getppid(), "port": flag("--port"), "cwd": os.getcwd(),
                      "marker": os.environ.get("MARKER"), "ipc": os.environ.get("VLLM_RPC_BASE_PATH"),
                      "ctrl_c_raises": signal.getsignal(signal.SIGINT) is signal.default_int_handler}), flush=True)
    if flag("--exit-with"):
        sys.exit(int(flag("--exit-with")))
    ThreadingHTTPServer(("127.0.0.1", int(flag("--port"))), Health).serve_forever()
"""


MakeForkServer = Callable[[], ForkServer]


@pytest.fixture
def program(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "program"
    folder.mkdir()
    (folder / "heavy_part.py").write_text(HEAVY)
    (folder / "server.py").write_text(PROGRAM)
    monkeypatch.setenv("IMPORTS", str(tmp_path / "imports"))
    return folder / "server.py"


def _server(tmp_path: Path, program: Path, forkserver: ForkServer | None = None, *flags: str,
            **environ: str) -> LocalVLLM:
    return LocalVLLM(model_folder(tmp_path / "model"), port=free_port(),
                     python=Path(sys.executable), entrypoint=(str(program),), extra_args=flags, environ=environ,
                     log_path=tmp_path / f"server-{time.monotonic_ns()}.log", forkserver=forkserver)


@pytest.fixture
def forkserver(tmp_path: Path, program: Path) -> Iterator[MakeForkServer]:
    """Makes the fork server of the program in the environment of the test's servers, when the
    test's body asks (pytest names the phase it is in, setup or call, in the environment)."""
    made: list[ForkServer] = []

    def make() -> ForkServer:
        probe = _server(tmp_path, program)
        made.append(ForkServer(probe.python, probe.entrypoint, probe.environment(), tmp_path / "forkserver.log"))
        return made[-1]

    yield make
    for server in made:
        server.kill()
        server.close()


def _said(server: LocalVLLM) -> dict[str, Any]:
    wait_until(lambda: server.log_path.exists() and "{" in server.log_path.read_text())
    return json.loads(next(line for line in server.log_path.read_text().splitlines() if line.startswith("{")))


def test_each_server_is_forked_from_one_import_with_its_own_arguments_environment_folder_and_log(
        tmp_path: Path, program: Path, forkserver: MakeForkServer, monkeypatch: pytest.MonkeyPatch) -> None:
    forks, said = forkserver(), []
    for folder in ("first", "second"):
        (tmp_path / folder).mkdir()
        monkeypatch.chdir(tmp_path / folder)
        with _server(tmp_path, program, forks) as server:
            assert isinstance(server.process, ForkedServer)
            said.append(_said(server))
            assert said[-1]["port"] == str(server.port) and said[-1]["pid"] == server.process.pid
            assert server.ipc_folder is not None and said[-1]["ipc"] == str(server.ipc_folder)
            assert said[-1]["ctrl_c_raises"]  # as in a new python, not the fork server's handlers
        assert server.process.returncode == -signal.SIGTERM and not running(said[-1]["pid"])
    assert forks.process is not None
    assert (tmp_path / "imports").read_text().split() == [str(forks.process.pid)]
    assert [entry["ppid"] for entry in said] == [forks.process.pid] * 2
    assert [entry["cwd"] for entry in said] == [str(tmp_path / "first"), str(tmp_path / "second")]
    assert "forked server pid" in (tmp_path / "forkserver.log").read_text()


def test_a_launch_in_another_environment_gets_a_process_of_its_own(tmp_path: Path, program: Path,
                                                                   forkserver: MakeForkServer) -> None:
    forks = forkserver()
    with _server(tmp_path, program, forks, MARKER="other") as server:
        assert isinstance(server.process, subprocess.Popen)
        assert _said(server)["marker"] == "other"
    assert forks.process is None  # never needed


def test_a_servers_exit_code_reaches_the_launcher(tmp_path: Path, program: Path, forkserver: MakeForkServer) -> None:
    server = _server(tmp_path, program, forkserver(), "--exit-with", "3")
    with pytest.raises(VLLMStartError, match="exited with code 3"):
        server.start(timeout=60)


def test_a_program_that_fails_to_import_fails_the_start_with_its_traceback(tmp_path: Path, program: Path,
                                                                            forkserver: MakeForkServer) -> None:
    (program.parent / "heavy_part.py").write_text("raise ImportError('no such engine here')\n")
    forks = forkserver()
    with pytest.raises(VLLMStartError, match="(?s)exited with code 1.*no such engine here"):
        _server(tmp_path, program, forks).start(timeout=60)
    assert forks.process is not None and forks.process.poll() == 1


def test_a_launch_after_the_fork_server_ended_ends_at_once_with_its_code_and_log(tmp_path: Path, program: Path,
                                                                                 forkserver: MakeForkServer) -> None:
    (program.parent / "heavy_part.py").write_text("raise ImportError('no such engine here')\n")
    forks = forkserver()
    first = forks.launch(["--port", str(free_port())], forks.environment, tmp_path / "first.log")
    assert first.wait(60) == 1
    # nothing reads this request: the fork server is gone, as when its import fails before a launch is sent
    second = forks.launch(["--port", str(free_port())], forks.environment, tmp_path / "second.log")
    assert second.poll() == 1 and "no such engine here" in second.log_path.read_text()


def test_a_stop_before_the_fork_ends_the_fork_server(tmp_path: Path, program: Path, forkserver: MakeForkServer,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HEAVY_SECONDS", "60")  # the fork server is still importing when the stop comes
    forks = forkserver()
    server = _server(tmp_path, program, forks)
    server.launch()
    started = time.monotonic()
    server.stop()
    assert time.monotonic() - started < 15
    assert server.process is not None and server.process.poll() is not None
    assert forks.process is not None and forks.process.poll() is not None


def test_the_servers_end_with_the_fork_server(tmp_path: Path, program: Path, forkserver: MakeForkServer) -> None:
    forks = forkserver()
    server = _server(tmp_path, program, forks).start(timeout=60)
    pid = _said(server)["pid"]
    forks.kill()
    all_gone([pid])
    assert server.process is not None and server.process.wait(10) == -signal.SIGTERM
    server.stop()


def test_closing_lets_the_fork_server_exit(tmp_path: Path, program: Path, forkserver: MakeForkServer) -> None:
    forks = forkserver()
    _server(tmp_path, program, forks).start(timeout=60).stop()
    forks.close()
    assert forks.process is not None and forks.process.returncode == 0


STARTER = """
import sys, time
from pathlib import Path
from atroposlib.local.forkserver import ForkServer
from atroposlib.local.vllm_service import LocalVLLM

model, program, port, log = sys.argv[1:]
server = LocalVLLM(Path(model), port=int(port), python=Path(sys.executable), entrypoint=(program,),
                   log_path=Path(log))
server.forkserver = ForkServer(server.python, server.entrypoint, server.environment(), Path(log))
server.start(timeout=60)
print(server.forkserver.process.pid, flush=True)
time.sleep(600)
"""


def test_the_fork_server_and_its_servers_end_with_the_process_that_started_them(tmp_path: Path,
                                                                                program: Path) -> None:
    log = tmp_path / "server.log"
    starter = subprocess.Popen([sys.executable, "-c", textwrap.dedent(STARTER), str(model_folder(tmp_path / "model")),
                                str(program), str(free_port()), str(log)], stdout=subprocess.PIPE, text=True)
    with killed_at_exit(starter):
        assert starter.stdout is not None
        forkserver_pid = int(starter.stdout.readline())
        wait_until(lambda: "{" in log.read_text())
        server_pid = json.loads(next(line for line in log.read_text().splitlines() if line.startswith("{")))["pid"]
        assert running(forkserver_pid) and running(server_pid)
        os.kill(starter.pid, signal.SIGKILL)
        starter.wait()
        all_gone([forkserver_pid, server_pid])
