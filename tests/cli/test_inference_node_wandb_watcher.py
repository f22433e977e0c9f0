"""`inference-node-wandb-watcher`: its loop against fake servers (httpx MockTransport), and
the real console script against a live `run-api` and a fake inference server, with W&B
offline (the gauges read back from the offline run's file) and disabled."""

from __future__ import annotations

import http.server
import os
import queue
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any, Iterator, Optional

import httpx
import pytest

from atroposlib.cli import inference_node_wandb_watcher as watcher_cli
from atroposlib.cli.inference_node_wandb_watcher import Options, Watcher, parse_options, wandb_mode
from tests.conftest import registration
from tests.doc_commands import readme_arguments
from tests.helpers import ApiProcess, free_port

SCRIPT = Path(sys.executable).with_name("inference-node-wandb-watcher")


# -- fakes for the unit tests ---------------------------------------------------------------
class FakeApi:
    """`/wandb_info` and `/status` of a trajectory API, with switchable failures."""

    def __init__(self) -> None:
        self.project: Optional[str] = None
        self.group: Optional[str] = "grp"
        self.step = 0
        self.failure: Optional[str] = None  # "500", "refused", "garbage", "timeout"
        self.requests: list[httpx.Request] = []

    def handle(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        if self.failure == "refused":
            raise httpx.ConnectError("Connection refused", request=request)
        if self.failure == "timeout":
            raise httpx.ReadTimeout("timed out", request=request)
        if self.failure == "500":
            return httpx.Response(500, text="boom")
        if self.failure == "garbage":
            return httpx.Response(200, text="<html>not json</html>")
        if request.url.path == "/wandb_info":
            return httpx.Response(200, json={"project": self.project, "group": self.group})
        if request.url.path == "/status":
            return httpx.Response(200, json={"current_step": self.step, "queue_size": 0})
        return httpx.Response(404)


class FakeServers:
    """Inference servers by port: an HTTP status, or None for connection refused."""

    def __init__(self, statuses: dict[int, Optional[int]]) -> None:
        self.statuses = statuses
        self.requests: list[httpx.Request] = []

    def handle(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        assert request.url.path == "/health_generate"
        status = self.statuses.get(request.url.port)
        if status is None:
            raise httpx.ConnectError("Connection refused", request=request)
        return httpx.Response(status)


class Rig:
    def __init__(self, num_servers: int = 2, node_num: int = 3, **option_overrides: Any) -> None:
        self.options = Options(api_addr="http://api.test", node_num=node_num, num_servers=num_servers,
                               interval=60.0, **option_overrides)
        self.api = FakeApi()
        self.servers = FakeServers({9000 + i: 200 for i in range(num_servers)})
        self.lines: list[str] = []
        self.logged: list[tuple[dict[str, float], int]] = []
        self.now = 1000.0
        self.sleeps: list[float] = []
        self.watcher = Watcher(
            self.options,
            httpx.Client(base_url=self.options.api_addr, transport=httpx.MockTransport(self.api.handle),
                         headers={"Authorization": "Bearer k"}),
            httpx.Client(transport=httpx.MockTransport(self.servers.handle)),
            out=self.lines.append, sleep=self.sleep, clock=lambda: self.now,
        )
        self.watcher.log_gauges = lambda gauges, step: self.logged.append((gauges, step))

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


# -- the loop -------------------------------------------------------------------------------
def test_gauges_are_named_per_node_and_server_and_start_at_zero() -> None:
    rig = Rig(num_servers=4, node_num=7)
    assert rig.watcher.gauges == {f"server/server_health_7_{i}": 0.0 for i in range(4)}


def test_first_tick_probes_then_logs_at_the_current_step_even_zero() -> None:
    rig = Rig(num_servers=3)
    rig.servers.statuses = {9000: 200, 9001: 503, 9002: None}
    rig.watcher.tick()
    assert rig.logged == [({"server/server_health_3_0": 1.0, "server/server_health_3_1": 0.0,
                            "server/server_health_3_2": 0.0}, 0)]
    assert [str(r.url) for r in rig.servers.requests] == [
        f"http://localhost:{9000 + i}/health_generate" for i in range(3)]


def test_logs_only_when_the_step_increases() -> None:
    rig = Rig(num_servers=1)
    rig.api.step = 4
    rig.watcher.tick()
    rig.watcher.tick()  # same step
    rig.api.step = 2    # a step going back (a replaced run) is not logged
    rig.watcher.tick()
    rig.api.step = 6
    rig.servers.statuses[9000] = None
    rig.watcher.tick()
    assert rig.logged == [({"server/server_health_3_0": 1.0}, 4), ({"server/server_health_3_0": 0.0}, 6)]


def test_health_changes_are_printed_once_each() -> None:
    rig = Rig(num_servers=2)
    rig.watcher.tick()
    health = [line for line in rig.lines if line.startswith("health:")]
    assert health == ["health: server 0 (http://localhost:9000/health_generate) up, "
                      "server 1 (http://localhost:9001/health_generate) up"]
    rig.watcher.tick()
    rig.servers.statuses[9001] = 500
    rig.watcher.tick()
    rig.watcher.tick()
    health = [line for line in rig.lines if line.startswith("health:")]
    assert health[1:] == ["health: server 1 (http://localhost:9001/health_generate) DOWN"]
    assert any(line.startswith("logged the first gauges at step 0 (2/2 servers up)") for line in rig.lines)


@pytest.mark.parametrize("failure", ["refused", "timeout", "500", "garbage"])
def test_status_failures_never_crash_and_are_reported_once_per_streak(failure: str) -> None:
    rig = Rig(num_servers=1)
    rig.api.step = 1
    rig.watcher.tick()
    rig.api.failure = failure
    for _ in range(3):
        rig.watcher.tick()
    rig.api.failure = None
    rig.api.step = 2
    rig.watcher.tick()
    rig.api.failure = failure
    rig.watcher.tick()
    failed = [line for line in rig.lines if "/status failed" in line]
    assert len(failed) == 2, rig.lines
    assert sum("/status works again" in line for line in rig.lines) == 1
    assert [step for _, step in rig.logged] == [1, 2]


def test_unauthorized_status_names_the_key_variable() -> None:
    rig = Rig(num_servers=1)
    rig.watcher.api = httpx.Client(base_url="http://api.test",
                                   transport=httpx.MockTransport(lambda request: httpx.Response(401)))
    rig.watcher.tick()
    assert any("HTTP 401" in line and "ATROPOS_API_KEY" in line for line in rig.lines)
    assert rig.logged == []


def test_a_failing_wandb_log_is_reported_and_retried() -> None:
    rig = Rig(num_servers=1)
    calls: list[int] = []

    def flaky(gauges: dict[str, float], step: int) -> None:
        calls.append(step)
        if len(calls) == 1:
            raise RuntimeError("wandb-core went away")

    rig.watcher.log_gauges = flaky
    rig.watcher.tick()
    rig.watcher.tick()  # not logged yet, so the same step is tried again
    assert calls == [0, 0]
    assert sum("logging to W&B failed" in line for line in rig.lines) == 1


def test_waits_for_a_project_polling_every_second() -> None:
    rig = Rig()
    polls = 0

    def handle(request: httpx.Request) -> httpx.Response:
        nonlocal polls
        polls += 1
        if polls <= 2:
            raise httpx.ConnectError("Connection refused", request=request)
        if polls <= 4:
            return httpx.Response(200, json={"project": None, "group": None})
        return httpx.Response(200, json={"project": "proj", "group": "g1"})

    rig.watcher.api = httpx.Client(base_url="http://api.test", transport=httpx.MockTransport(handle))
    assert rig.watcher.wait_for_wandb_info() == ("proj", "g1")
    assert rig.sleeps == [1.0, 1.0, 1.0, 1.0]
    assert sum("/wandb_info failed" in line for line in rig.lines) == 1
    assert sum("/wandb_info works again" in line for line in rig.lines) == 1


def test_run_ticks_every_interval_counting_the_probe_time() -> None:
    rig = Rig(num_servers=1)

    def slow(request: httpx.Request) -> httpx.Response:
        rig.now += 2.5  # each probe takes 2.5 s of the 60 s interval
        return httpx.Response(200)

    rig.watcher.probes = httpx.Client(transport=httpx.MockTransport(slow))
    steps = iter([1, 1, 2])

    def status(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json={"current_step": next(steps)})

    rig.watcher.api = httpx.Client(base_url="http://api.test", transport=httpx.MockTransport(status))
    rig.watcher.run(lambda gauges, step: rig.logged.append((gauges, step)), ticks=3)
    assert rig.sleeps == [57.5, 57.5]
    assert [step for _, step in rig.logged] == [1, 2]


def test_bearer_token_goes_to_the_api_only(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ATROPOS_API_KEY", "s3cret")
    assert watcher_cli.api_headers() == {"Authorization": "Bearer s3cret"}
    monkeypatch.delenv("ATROPOS_API_KEY")
    assert watcher_cli.api_headers() == {}
    rig = Rig(num_servers=1)
    rig.watcher.tick()
    assert all(r.headers.get("authorization") == "Bearer k" for r in rig.api.requests)
    assert all("authorization" not in r.headers for r in rig.servers.requests)


def test_host_and_base_port_choose_the_probed_urls() -> None:
    assert Options("http://a", 0, 2, base_port=8100, host="10.0.0.5").health_url(1) == \
        "http://10.0.0.5:8101/health_generate"
    assert Options("http://a", 0, 1, host="::1").health_url(0) == "http://[::1]:9000/health_generate"


# -- flags ----------------------------------------------------------------------------------
def test_atropos_flags_and_defaults() -> None:
    options = parse_options(["--api_addr", "http://h:8000/", "--tp", "2", "--node_num", "5"])
    assert options == Options(api_addr="http://h:8000", node_num=5, num_servers=4, base_port=9000,
                              host="localhost", interval=60.0, timeout=10.0)


def test_dashed_aliases_and_extra_flags() -> None:
    options = parse_options(["--api-addr", "h:8000", "--tp", "8", "--node-num", "1", "--num-servers", "3",
                             "--base-port", "7000", "--interval", "0.5", "--host", "gpu1", "--timeout", "2"])
    assert options == Options(api_addr="http://h:8000", node_num=1, num_servers=3, base_port=7000,
                              host="gpu1", interval=0.5, timeout=2.0)


@pytest.mark.parametrize("argv, message", [
    (["--tp", "0"], "--tp must be between 1 and 8"),
    (["--tp", "16"], "--tp must be between 1 and 8"),
    (["--tp", "1", "--num-servers", "0"], "--num-servers must be at least 1"),
    (["--tp", "1", "--interval", "0"], "--interval must be a positive"),
    (["--tp", "1", "--base-port", "65530"], "not all valid TCP ports"),
])
def test_bad_flags_are_usage_errors(argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        parse_options(["--api_addr", "http://h", "--node_num", "0", *argv])
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_without_a_wandb_key_it_logs_offline_instead_of_asking(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in ("WANDB_MODE", "WANDB_DISABLED", "WANDB_API_KEY", "WANDB_BASE_URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("NETRC", str(tmp_path / "no-netrc"))
    lines: list[str] = []
    assert wandb_mode(lines.append) == "offline"
    assert "logging offline" in lines[0]
    monkeypatch.setenv("WANDB_MODE", "online")  # online without a key would still ask
    assert wandb_mode(lines.append) == "offline"
    for mode in ("disabled", "offline", "dryrun"):
        monkeypatch.setenv("WANDB_MODE", mode)
        assert wandb_mode(lines.append) is None
    monkeypatch.delenv("WANDB_MODE")
    monkeypatch.setenv("WANDB_API_KEY", "x" * 40)
    assert wandb_mode(lines.append) is None


def test_a_wandb_that_does_not_start_online_falls_back_to_offline(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[Optional[str]] = []

    def init(**kwargs: Any) -> str:
        calls.append(kwargs["mode"])
        if kwargs["mode"] != "offline":
            raise RuntimeError("api key rejected")
        return "offline-run"

    monkeypatch.setitem(sys.modules, "wandb", type(sys)("wandb"))
    monkeypatch.setattr(sys.modules["wandb"], "init", init, raising=False)
    monkeypatch.setenv("WANDB_API_KEY", "x" * 40)
    monkeypatch.delenv("WANDB_MODE", raising=False)
    lines: list[str] = []
    assert watcher_cli.start_wandb("p", "g", "inf_node_0", lines.append) == "offline-run"
    assert calls == [None, "offline"]
    assert lines == ["W&B did not start (RuntimeError: api key rejected); logging offline instead"]


@pytest.mark.parametrize("signum, code", [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_a_stop_signal_ends_main_with_128_plus_its_number(
        signum: int, code: int, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    finished: list[bool] = []

    def watch(options: Options) -> None:
        try:
            os.kill(os.getpid(), signum)
            time.sleep(5)
        finally:
            finished.append(True)

    monkeypatch.setattr(watcher_cli, "watch", watch)
    with pytest.raises(SystemExit) as exit_info:
        watcher_cli.main(["--api_addr", "http://h", "--tp", "1", "--node_num", "0"])
    assert exit_info.value.code == code
    assert finished == [True]
    assert f"stopped by {signal.Signals(signum).name}" in capsys.readouterr().out


# -- the real console script ----------------------------------------------------------------
class HealthServer:
    """A fake inference server answering `/health_generate` with 200, in a thread."""

    def __init__(self) -> None:
        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802
                self.send_response(200 if self.path == "/health_generate" else 404)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def stop(self) -> None:
        if self.thread.is_alive():
            self.server.shutdown()
            self.server.server_close()
            self.thread.join(5)


class WatcherProcess:
    """The console script with its stdout and stderr read line by line in a thread."""

    def __init__(self, args: list[str], env: dict[str, str]) -> None:
        self.marker = uuid.uuid4().hex
        env = {**env, "ATROPOS_WATCHER_TEST_MARKER": self.marker, "PYTHONUNBUFFERED": "1"}
        self.process = subprocess.Popen([str(SCRIPT), *args], env=env, stdout=subprocess.PIPE,
                                        stderr=subprocess.STDOUT, text=True)
        self.lines: list[str] = []
        self._queue: "queue.Queue[str]" = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self._queue.put(line.rstrip("\n"))

    def wait_for(self, text: str, timeout: float = 20.0) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                line = self._queue.get(timeout=0.1)
            except queue.Empty:
                if self.process.poll() is not None and self._queue.empty():
                    break
                continue
            self.lines.append(line)
            if text in line:
                return line
        raise AssertionError(f"no line containing {text!r}; output so far:\n" + "\n".join(self.lines))

    def stop(self, signum: int = signal.SIGTERM, timeout: float = 20.0) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signum)
        try:
            code = self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(10)
            raise
        time.sleep(0.2)
        while not self._queue.empty():
            self.lines.append(self._queue.get())
        return code

    def leftovers(self) -> list[int]:
        """Processes still running that inherited this watcher's environment (wandb-core...)."""
        found = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                environ = (entry / "environ").read_bytes()
            except OSError:
                continue
            if self.marker.encode() in environ:
                found.append(int(entry.name))
        return found


def _base_env(tmp_path: Path, mode: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_") and k != "ATROPOS_API_KEY"}
    env.update(WANDB_MODE=mode, WANDB_DIR=str(tmp_path), WANDB_CONFIG_DIR=str(tmp_path / "wandb-config"),
               WANDB_CACHE_DIR=str(tmp_path / "wandb-cache"), WANDB_SILENT="true", HOME=str(tmp_path))
    return env


def _wandb_records(run_file: Path) -> Iterator[Any]:
    """Records of a `.wandb` file: a 7-byte header, then LevelDB-log chunks (4-byte CRC,
    2-byte length, 1-byte type) in 32 KiB blocks, each record a protobuf `Record`."""
    from wandb.proto import wandb_internal_pb2

    data = run_file.read_bytes()
    assert data[:4] == b":W&B"
    block, pos, pending = 32768, 7, b""
    while pos + 7 <= len(data):
        if block - pos % block < 7:
            pos += block - pos % block
            continue
        length, kind = int.from_bytes(data[pos + 4:pos + 6], "little"), data[pos + 6]
        chunk, pos = data[pos + 7:pos + 7 + length], pos + 7 + length
        if kind == 0:
            break
        pending = chunk if kind in (1, 2) else pending + chunk
        if kind in (1, 4):
            yield wandb_internal_pb2.Record.FromString(pending)


def _history(run_file: Path) -> dict[int, dict[str, float]]:
    import json

    history: dict[int, dict[str, float]] = {}
    for record in _wandb_records(run_file):
        if record.WhichOneof("record_type") == "history":
            items = {item.key or "/".join(item.nested_key): json.loads(item.value_json)
                     for item in record.history.item}
            history[int(items.pop("_step"))] = {k: v for k, v in items.items() if k.startswith("server/")}
    return history


@pytest.mark.slow
def test_offline_run_logs_the_gauges_and_stops_on_sigterm(tmp_path: Path) -> None:
    health = HealthServer()
    watcher: Optional[WatcherProcess] = None
    try:
        with ApiProcess(tmp_path / "state") as api:
            httpx.post(api.url + "/register", json=registration(
                8, wandb_project="watch-proj", wandb_group="watch-grp", starting_step=5)).raise_for_status()
            readme = readme_arguments("console-tools", "inference-node-wandb-watcher", {"http://localhost:8000": api.url})
            watcher = WatcherProcess([*readme, "--tp", "8", "--node_num", "4",
                                      "--base-port", str(health.port), "--interval", "0.2"],
                                     _base_env(tmp_path, "offline"))
            watcher.wait_for("watching 1 server(s)")
            watcher.wait_for("logged the first gauges at step 5 (1/1 servers up)")
            health.stop()
            watcher.wait_for("server 0 (http://localhost:%d/health_generate) DOWN" % health.port)
            httpx.post(api.url + "/register", json=registration(
                8, wandb_project="watch-proj", wandb_group="watch-grp", starting_step=9,
                replace=True)).raise_for_status()
            time.sleep(1.5)  # several ticks: the step-9 gauges are logged
            assert watcher.stop(signal.SIGTERM) == 143
            assert watcher.leftovers() == []
        output = "\n".join(watcher.lines)
        assert "Traceback" not in output
        assert "stopped by SIGTERM" in output
        run_files = list(tmp_path.glob("wandb/offline-run-*/run-*.wandb"))
        assert len(run_files) == 1, output
        history = _history(run_files[0])
        assert history[5] == {"server/server_health_4_0": 1}
        assert history[9] == {"server/server_health_4_0": 0}
        records = list(_wandb_records(run_files[0]))
        run = next(r.run for r in records if r.WhichOneof("record_type") == "run")
        assert (run.project, run.run_group, run.display_name) == ("watch-proj", "watch-grp", "inf_node_4")
        assert any(r.WhichOneof("record_type") == "exit" for r in records), "wandb.finish was not called"
    finally:
        if watcher is not None and watcher.process.poll() is None:
            watcher.process.kill()
            watcher.process.wait(10)
        health.stop()


@pytest.mark.slow
def test_disabled_wandb_waits_out_a_missing_api_and_stops_on_ctrl_c(tmp_path: Path) -> None:
    health = HealthServer()
    port = free_port()
    watcher: Optional[WatcherProcess] = None
    try:
        env = {**_base_env(tmp_path, "disabled"), "ATROPOS_API_KEY": "k3y"}
        watcher = WatcherProcess(["--api-addr", f"http://127.0.0.1:{port}", "--tp", "8", "--node-num", "0",
                                  "--base-port", str(health.port), "--interval", "0.2"], env)
        watcher.wait_for("/wandb_info failed: ConnectError")
        with ApiProcess(tmp_path / "state", "--api-key", "k3y", port=port) as api:
            httpx.post(api.url + "/register", headers={"Authorization": "Bearer k3y"},
                       json=registration(8, wandb_project="p", starting_step=2)).raise_for_status()
            watcher.wait_for("/wandb_info works again")
            watcher.wait_for("watching 1 server(s)")
            watcher.wait_for("logged the first gauges at step 2 (1/1 servers up)")
            assert watcher.stop(signal.SIGINT) == 130
            assert watcher.leftovers() == []
        output = "\n".join(watcher.lines)
        assert "Traceback" not in output
        assert sum("/wandb_info failed" in line for line in watcher.lines) == 1
        assert not list(tmp_path.glob("wandb/*run-*")), "a disabled run wrote files"
    finally:
        if watcher is not None and watcher.process.poll() is None:
            watcher.process.kill()
            watcher.process.wait(10)
        health.stop()
