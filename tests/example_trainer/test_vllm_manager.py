"""The trainer's vLLM launcher with a stand-in server: which python runs it, the command
line, a port held by someone else (an error, never a kill), stops that leave nothing of
the server's process group, a server launched ahead that the start then waits for, and the
adapter hot-swap fallback."""

from __future__ import annotations

import json
import os
import shlex
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Iterator

import pytest

from atroposlib.local.forkserver import ForkedServer
from example_trainer import vllm_manager
from example_trainer.config import TrainingConfig
from example_trainer.vllm_manager import (
    SERVER_SCRIPT,
    PortInUseError,
    TrainerVLLM,
    VLLMPythonNotFoundError,
    hotswap_lora_adapter,
    resolve_vllm_python,
)
from tests.helpers import free_port
from tests.local.stand_ins import (
    all_gone,
    killed_at_exit,
    model_folder,
    parent_of,
    recorded_pids,
    running,
    stand_in_runtime,
)


def _config(**fields: Any) -> TrainingConfig:
    return TrainingConfig(**{"model_name": "tiny-model", "dtype": "float32", "vllm_port": free_port(), **fields})


def test_the_python_is_the_flag_then_this_interpreter_then_the_runtime(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    runtime = stand_in_runtime(tmp_path)
    monkeypatch.setenv("ATROPOS_VLLM_RUNTIME", str(runtime.path))
    monkeypatch.setattr(vllm_manager, "_vllm_importable", lambda: True)
    assert resolve_vllm_python(_config(vllm_python=str(runtime.python))) == runtime.python
    assert resolve_vllm_python(_config()) == Path(sys.executable)
    monkeypatch.setattr(vllm_manager, "_vllm_importable", lambda: False)
    assert resolve_vllm_python(_config()) == runtime.python
    monkeypatch.setenv("ATROPOS_VLLM_RUNTIME", str(tmp_path / "missing"))
    with pytest.raises(VLLMPythonNotFoundError, match="--vllm-python.*atropos-vllm install"):
        resolve_vllm_python(_config())
    with pytest.raises(VLLMPythonNotFoundError, match="no such file"):
        resolve_vllm_python(_config(vllm_python=str(tmp_path / "nope")))


def test_the_command_runs_the_bundled_server_with_the_config(tmp_path: Path) -> None:
    config = _config(vllm_python=str(stand_in_runtime(tmp_path).python), weight_bridge_mode="lora_only",
                     lora_r=64, max_model_len=512, vllm_gpu=1)
    server = TrainerVLLM(config, tmp_path / "vllm.log").server_for("/models/step_3")
    command = server.command()
    assert command[:4] == [str(config.vllm_python), str(SERVER_SCRIPT), "--model", "/models/step_3"]
    flags = dict(zip(command[4::2], command[5::2]))
    assert flags["--served-model-name"] == "tiny-model" and flags["--host"] == "127.0.0.1"
    assert (flags["--port"], flags["--dtype"], flags["--max-model-len"]) == (str(config.vllm_port), "float32", "512")
    assert "--enforce-eager" in command and "--enable-lora" in command
    assert command[command.index("--max-lora-rank") + 1] == "128"
    assert server.environment()["CUDA_VISIBLE_DEVICES"] == "1"


def test_the_command_line_for_users_carries_the_cpu_kv_cache_size(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("VLLM_CPU_KVCACHE_SPACE", raising=False)
    manager = TrainerVLLM(_config(vllm_python=str(stand_in_runtime(tmp_path).python), weight_bridge_mode="lora_only"),
                          tmp_path / "vllm.log")
    server = manager.server_for("/models/base")
    if server.gpu:
        pytest.skip("on a GPU vLLM needs no CPU settings")
    words = shlex.split(manager.command_line("/models/base"))
    assert words[0].startswith("VLLM_CPU_KVCACHE_SPACE=")  # without it vLLM reserves most of the RAM
    assert words[words.index(str(manager.python)):] == server.command()
    assert "--enable-lora" in words and "--enforce-eager" in words


@pytest.fixture
def stand_in(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[TrainerVLLM, Path]]:
    """A TrainerVLLM whose python is the stand-in vLLM (a server and an 'engine' child)."""
    pids = tmp_path / "pids"
    monkeypatch.setenv("STAND_IN_PIDS", str(pids))
    config = _config(vllm_python=str(stand_in_runtime(tmp_path).python))
    with TrainerVLLM(config, tmp_path / "vllm.log") as manager:
        yield manager, pids


def test_stop_ends_the_whole_process_group_and_restart_starts_a_new_one(
        stand_in: tuple[TrainerVLLM, Path], tmp_path: Path) -> None:
    manager, pids = stand_in
    model = str(model_folder(tmp_path / "model"))
    assert manager.start(model, timeout=60) > 0 and manager.is_running()
    assert manager.base_url == f"http://127.0.0.1:{manager.port}/v1"
    first = recorded_pids(pids, 2)
    assert manager.server is not None and manager.server.process is not None
    group = manager.server.process.pid
    assert {os.getpgid(pid) for pid in first} == {group}
    manager.restart(model, timeout=60)
    all_gone(first)
    second = recorded_pids(pids, 4)[2:]
    manager.stop()
    all_gone(second)
    assert not manager.is_running() and _live_members(group) == []


def test_a_start_waits_for_the_server_launched_ahead_on_the_same_weights(
        stand_in: tuple[TrainerVLLM, Path], tmp_path: Path) -> None:
    manager, pids = stand_in
    model = str(model_folder(tmp_path / "model"))
    manager.launch(model, policy_version=3)
    launched = recorded_pids(pids, 2)
    time.sleep(1.0)  # the trainer loads its model meanwhile
    assert manager.start(model, policy_version=3, timeout=60) >= 1.0  # counted from the launch
    assert manager.is_running() and recorded_pids(pids, 2) == launched  # no second server
    manager.stop()
    all_gone(launched)


def test_a_start_on_other_weights_than_launched_replaces_the_server(
        stand_in: tuple[TrainerVLLM, Path], tmp_path: Path) -> None:
    manager, pids = stand_in
    manager.launch(str(model_folder(tmp_path / "base")))
    launched = recorded_pids(pids, 2)
    manager.start(str(model_folder(tmp_path / "step_2")), policy_version=2, timeout=60)
    all_gone(launched)
    assert manager.is_running() and len(recorded_pids(pids, 4)) == 4
    assert manager.model_path == str(tmp_path / "step_2")


def test_a_run_that_restarts_its_server_forks_every_start_from_one_fork_server(
        stand_in: tuple[TrainerVLLM, Path], tmp_path: Path) -> None:
    manager, pids = stand_in  # --weight-bridge-mode none: a restart on each checkpoint
    model = str(model_folder(tmp_path / "model"))
    manager.start(model, timeout=60)
    first = manager.server.process if manager.server else None
    manager.restart(model, timeout=60)
    second = manager.server.process if manager.server else None
    assert isinstance(first, ForkedServer) and isinstance(second, ForkedServer)
    forks = manager.forkserver
    assert forks is not None and forks.process is not None and first.pid != second.pid
    assert parent_of(second.pid) == forks.process.pid
    manager.close()
    assert forks.process.poll() is not None and manager.forkserver is None
    all_gone(recorded_pids(pids, 4))


@pytest.mark.parametrize(("fields", "forks"), [
    ({"weight_bridge_mode": "none"}, True), ({"weight_bridge_mode": "lora_restart"}, True),
    ({"weight_bridge_mode": "reload", "vllm_stop_during_train": True}, True),
    ({"weight_bridge_mode": "reload"}, False), ({"weight_bridge_mode": "lora_only"}, False),
    ({"weight_bridge_mode": "none", "vllm_fork_server": False}, False)])
def test_only_a_run_that_starts_its_server_more_than_once_has_a_fork_server(
        tmp_path: Path, fields: dict[str, Any], forks: bool) -> None:
    manager = TrainerVLLM(_config(vllm_python=str(stand_in_runtime(tmp_path).python), **fields), tmp_path / "vllm.log")
    server = manager.server_for("/models/base")
    if server.gpu:
        pytest.skip("not tried on a GPU")
    chosen = manager._forkserver_for(server)
    assert (chosen is not None) == forks
    assert manager._forkserver_for(manager.server_for("/models/step_1", policy_version=1)) is chosen
    manager.close()


def _live_members(group: int) -> list[int]:
    """Processes of process group `group` that are not zombies (an orphan's reaper may be slow)."""
    members = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (FileNotFoundError, ProcessLookupError, IndexError):
            continue
        if int(fields[2]) == group and fields[0] not in ("Z", "X"):
            members.append(int(stat.parent.name))
    return members


def test_a_port_held_by_someone_else_is_an_error_and_the_holder_lives(
        stand_in: tuple[TrainerVLLM, Path], tmp_path: Path) -> None:
    manager, pids = stand_in
    holder = subprocess.Popen([sys.executable, "-m", "http.server", "--bind", "127.0.0.1", str(manager.port)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    with killed_at_exit(holder):
        _wait_listening(manager.port)
        with pytest.raises(PortInUseError, match=f"port {manager.port} is already in use"):
            manager.start(str(model_folder(tmp_path / "model")), timeout=30)
        assert running(holder.pid) and not manager.is_running() and not pids.exists()


def _wait_listening(port: int) -> None:
    from tests.local.stand_ins import wait_until

    def listening() -> bool:
        with socket.socket() as sock:
            return sock.connect_ex(("127.0.0.1", port)) == 0

    wait_until(listening, timeout=30)


class _AdapterRoutes(BaseHTTPRequestHandler):
    """Stock vLLM's adapter route is missing (404); the bundled server's records the body."""

    bodies: list[tuple[str, dict[str, Any]]] = []
    status = 200

    def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        _AdapterRoutes.bodies.append((self.path, body))
        code = 404 if self.path == "/v1/load_lora_adapter" else _AdapterRoutes.status
        payload = json.dumps({"status": "ok"} if code == 200 else {"detail": "broken adapter"}).encode()
        self.send_response(code)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, *args: object) -> None:
        pass


def test_adapters_fall_back_to_the_bundled_route(tmp_path: Path) -> None:
    http = ThreadingHTTPServer(("127.0.0.1", 0), _AdapterRoutes)
    thread = threading.Thread(target=http.serve_forever, daemon=True)
    thread.start()
    try:
        port = http.server_address[1]
        assert hotswap_lora_adapter("step_2", str(tmp_path), port)
        assert _AdapterRoutes.bodies[-2:] == [
            ("/v1/load_lora_adapter", {"lora_name": "step_2", "lora_path": str(tmp_path)}),
            ("/lora/load", {"adapter_path": str(tmp_path), "adapter_name": "step_2"})]
        _AdapterRoutes.status = 400
        assert not hotswap_lora_adapter("step_3", str(tmp_path), port)
    finally:
        http.shutdown()
        http.server_close()


class CountingServer:
    """Stands in for a running vLLM whose generation counter reads `counts` in turn."""

    def __init__(self, counts: list) -> None:
        self.counts = iter(counts)

    def is_running(self) -> bool:
        return True

    def generated_tokens(self):
        return next(self.counts)


def test_the_generation_meter_reports_tokens_per_second_between_readings(monkeypatch: pytest.MonkeyPatch) -> None:
    from example_trainer import vllm_manager

    clock = iter([0.0, 2.0, 3.0, 4.0, 6.0, 7.0])
    monkeypatch.setattr(vllm_manager.time, "monotonic", lambda: next(clock))
    meter = vllm_manager.GenerationMeter(CountingServer([100.0, 160.0, 10.0, 50.0, None]))
    assert meter.tokens_per_s() is None  # a first reading
    assert meter.tokens_per_s() == 30.0
    assert meter.tokens_per_s() is None  # the counter went back: vLLM restarted
    assert meter.tokens_per_s() == 40.0
    assert meter.tokens_per_s() is None  # no /metrics
    assert vllm_manager.GenerationMeter(None).tokens_per_s() is None


def test_vllm_serves_the_training_dtype_unless_told_another(tmp_path: Path) -> None:
    runtime = str(stand_in_runtime(tmp_path).python)

    def served_dtype(**fields: Any) -> str:
        command = TrainerVLLM(_config(vllm_python=runtime, **fields), tmp_path / "vllm.log").server_for("/m").command()
        return command[command.index("--dtype") + 1]

    assert served_dtype(dtype="bfloat16") == "bfloat16"
    assert served_dtype(dtype="bfloat16", vllm_dtype="float32") == "float32"
    assert served_dtype(dtype="float32", vllm_dtype="bfloat16") == "bfloat16"
