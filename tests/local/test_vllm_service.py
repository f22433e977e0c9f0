"""`atropos-vllm serve` and `LocalVLLM` with a stand-in runtime: the dtype on the command
line, and every stop signal stopping the server's whole process group."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from atroposlib.local.cpu import choose_dtype, read_cpu
from atroposlib.local.vllm_service import LocalVLLM, VLLMStartError
from tests.helpers import free_port
from tests.local.stand_ins import (
    all_gone,
    ipc_folder_of,
    killed_at_exit,
    model_folder,
    recorded_pids,
    running,
    signal_and_read,
    stand_in_runtime,
    wait_until,
)


def test_the_dtype_follows_the_cpu_unless_given(tmp_path: Path) -> None:
    runtime = stand_in_runtime(tmp_path)
    command = LocalVLLM(tmp_path / "model", port=9123, runtime=runtime).command()
    assert command[command.index("--dtype") + 1] == choose_dtype(read_cpu().flags).dtype
    forced = LocalVLLM(tmp_path / "model", port=9123, runtime=runtime, dtype="bfloat16")
    assert forced.command()[forced.command().index("--dtype") + 1] == "bfloat16"
    assert forced.dtype.reason == "asked for with --dtype"


def test_vllms_cache_is_in_atropos_home_unless_the_user_sets_one(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ATROPOS_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("VLLM_CACHE_ROOT", raising=False)
    runtime = stand_in_runtime(tmp_path)
    assert LocalVLLM(tmp_path / "model", runtime=runtime).environment()["VLLM_CACHE_ROOT"] == str(
        tmp_path / "home" / "vllm-cache")
    monkeypatch.setenv("VLLM_CACHE_ROOT", str(tmp_path / "mine"))
    assert LocalVLLM(tmp_path / "model", runtime=runtime).environment()["VLLM_CACHE_ROOT"] == str(tmp_path / "mine")


def test_vllms_sockets_go_with_the_server_unless_the_user_names_their_folder(tmp_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STAND_IN_PIDS", str(tmp_path / "pids"))
    monkeypatch.delenv("VLLM_RPC_BASE_PATH", raising=False)
    runtime = stand_in_runtime(tmp_path)
    server = LocalVLLM(model_folder(tmp_path / "model"), port=free_port(), runtime=runtime, log_path=tmp_path / "log")
    with server:
        folder = server.ipc_folder
        assert folder is not None and folder.parent == Path(tempfile.gettempdir())
        wait_until(lambda: any(path.is_socket() for path in folder.iterdir()))
    assert not folder.exists() and server.ipc_folder is None

    mine = Path(tempfile.mkdtemp(prefix="mine-"))  # a socket's path is short: not under tmp_path
    monkeypatch.setenv("VLLM_RPC_BASE_PATH", str(mine))
    try:
        with LocalVLLM(model_folder(tmp_path / "model"), port=free_port(), runtime=runtime,
                       log_path=tmp_path / "log") as server:
            assert server.ipc_folder is None
            wait_until(lambda: any(path.is_socket() for path in mine.iterdir()))
        assert mine.is_dir()  # the user's folder stays, with what vLLM leaves in it
    finally:
        shutil.rmtree(mine)


def _start_wrapper(tmp_path: Path, *flags: str, **environ: str) -> tuple[subprocess.Popen[str], Path]:
    runtime = stand_in_runtime(tmp_path)
    pids = tmp_path / "pids"
    env = {**os.environ, "ATROPOS_VLLM_RUNTIME": str(runtime.path), "ATROPOS_HOME": str(tmp_path / "home"),
           "STAND_IN_PIDS": str(pids), **environ}
    command = [sys.executable, "-m", "atroposlib.local.vllm_service", "serve", "--model",
               str(model_folder(tmp_path / "model")), "--port", str(free_port()), *flags]
    wrapper = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    return wrapper, pids


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP])
def test_a_stop_signal_stops_vllm_and_its_children(signum: int, tmp_path: Path) -> None:
    wrapper, pids = _start_wrapper(tmp_path, "--dtype", "float32")
    with killed_at_exit(wrapper):
        assert wrapper.stdout is not None
        lines = [wrapper.stdout.readline() for _ in range(4)]
        assert lines[1].strip() == "dtype: float32 (asked for with --dtype)", lines
        assert lines[2].strip().startswith("log:") and "vLLM is up at" in lines[3], lines
        server_pids = recorded_pids(pids, 2)
        assert all(running(pid) for pid in server_pids)
        output = signal_and_read(wrapper, signum)
    assert wrapper.returncode == 0, output
    assert f"stopped by {signal.Signals(signum).name}: vLLM stopped" in output
    all_gone(server_pids)


def test_the_server_dies_with_a_killed_wrapper(tmp_path: Path) -> None:
    wrapper, pids = _start_wrapper(tmp_path)
    with killed_at_exit(wrapper):
        server_pid, engine_pid = recorded_pids(pids, 2)
        sockets = ipc_folder_of(server_pid)  # a killed wrapper cannot remove it
        wrapper.kill()
        wrapper.wait(30)
    try:
        all_gone([server_pid])
    finally:
        for pid in (server_pid, engine_pid):  # the stand-in's engine outlives it (vLLM's does not)
            if running(pid):
                os.kill(pid, signal.SIGKILL)
        shutil.rmtree(sockets)


def test_a_stop_signal_during_start_up_leaves_nothing(tmp_path: Path) -> None:
    wrapper, pids = _start_wrapper(tmp_path, STAND_IN_UNHEALTHY="1")
    with killed_at_exit(wrapper):
        server_pids = recorded_pids(pids, 2)
        output = signal_and_read(wrapper, signal.SIGTERM)
    assert wrapper.returncode == 0 and output.rstrip().endswith("stopped by SIGTERM: vLLM stopped"), output
    all_gone(server_pids)


def test_a_start_that_times_out_leaves_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pids = tmp_path / "pids"
    monkeypatch.setenv("STAND_IN_PIDS", str(pids))
    monkeypatch.setenv("STAND_IN_UNHEALTHY", "1")
    server = LocalVLLM(model_folder(tmp_path / "model"), port=free_port(), runtime=stand_in_runtime(tmp_path),
                       log_path=tmp_path / "vllm.log")
    with pytest.raises(VLLMStartError, match="did not answer within 5 s"):
        server.start(timeout=5)
    assert server.process is not None and server.process.poll() is not None
    all_gone(recorded_pids(pids, 2))
