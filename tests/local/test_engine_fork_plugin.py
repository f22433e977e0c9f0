"""The vLLM plugin that forks the engine core on a CPU (``vllm_plugins/atropos_engine_fork.py``),
against a stand-in of vLLM's platform module; tests/local/test_real_vllm.py and
tests/example_trainer/test_vllm_api_server.py check the real servers' processes."""

from __future__ import annotations

import importlib
import importlib.metadata
import os
import sys
import types
from typing import Any

import pytest

from atroposlib.local.vllm_service import PLUGINS_DIR

METHOD = "VLLM_WORKER_MULTIPROC_METHOD"


class StandInPlatform:
    """Like vLLM's CPU platform: choosing the settings sets the start method to spawn and gives
    the workers processes of their own (the ``mp`` executor), even a single one."""

    def __init__(self, cpu: bool) -> None:
        self.cpu = cpu

    def is_cpu(self) -> bool:
        return self.cpu

    @classmethod
    def check_and_update_config(cls, vllm_config: Any) -> None:
        os.environ[METHOD] = "spawn"
        if cls().is_cpu():
            vllm_config.parallel_config.distributed_executor_backend = "mp"


def _config(executor: str) -> Any:
    """A stand-in of vLLM's config where vLLM chose `executor` for the workers."""
    return types.SimpleNamespace(parallel_config=types.SimpleNamespace(distributed_executor_backend=executor))


def _plugin(monkeypatch: pytest.MonkeyPatch, cpu: bool) -> tuple[types.ModuleType, type[StandInPlatform]]:
    """The plugin, imported afresh where vLLM's platform is a `StandInPlatform` of its own."""
    platform = type("Platform", (StandInPlatform,), {"__init__": lambda self: StandInPlatform.__init__(self, cpu)})
    platforms = types.ModuleType("vllm.platforms")
    platforms.current_platform = platform()  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "vllm", types.ModuleType("vllm"))
    monkeypatch.setitem(sys.modules, "vllm.platforms", platforms)
    monkeypatch.delitem(sys.modules, "atropos_engine_fork", raising=False)
    monkeypatch.syspath_prepend(str(PLUGINS_DIR))
    monkeypatch.delenv(METHOD, raising=False)  # the fork handler it registers acts on "fork" only
    return importlib.import_module("atropos_engine_fork"), platform


def _method_in_a_forked_child() -> str:
    read, write = os.pipe()
    child = os.fork()
    if child == 0:
        os.write(write, os.environ.get(METHOD, "unset").encode())
        os._exit(0)
    os.close(write)
    os.waitpid(child, 0)
    with os.fdopen(read) as answer:
        return answer.read()


def test_on_a_cpu_the_next_process_is_forked_and_its_own_children_spawned(monkeypatch: pytest.MonkeyPatch) -> None:
    plugin, platform = _plugin(monkeypatch, cpu=True)
    plugin.fork_the_engine_core()
    config = _config("uni")
    platform.check_and_update_config(config)
    assert os.environ[METHOD] == "fork"  # the API server forks the engine core
    assert config.parallel_config.distributed_executor_backend == "uni"  # which runs a single worker itself
    assert _method_in_a_forked_child() == "spawn"  # and spawns several
    patched = platform.check_and_update_config
    plugin.fork_the_engine_core()  # vLLM loads plugins again in its other processes
    assert platform.check_and_update_config == patched


def test_several_workers_keep_their_own_processes(monkeypatch: pytest.MonkeyPatch) -> None:
    plugin, platform = _plugin(monkeypatch, cpu=True)
    plugin.fork_the_engine_core()
    config = _config("mp")  # what vLLM chooses for tensor or pipeline parallel > 1
    platform.check_and_update_config(config)
    assert config.parallel_config.distributed_executor_backend == "mp"


def test_other_platforms_are_left_as_they_are(monkeypatch: pytest.MonkeyPatch) -> None:
    plugin, platform = _plugin(monkeypatch, cpu=False)
    plugin.fork_the_engine_core()
    config = _config("uni")
    platform.check_and_update_config(config)
    assert os.environ[METHOD] == "spawn"
    assert config.parallel_config.distributed_executor_backend == "uni"


def test_vllm_finds_the_plugin_on_the_servers_python_path(monkeypatch: pytest.MonkeyPatch) -> None:
    plugin, _ = _plugin(monkeypatch, cpu=True)
    found = [entry for distribution in importlib.metadata.distributions(path=[str(PLUGINS_DIR)])
             for entry in distribution.entry_points if entry.group == "vllm.general_plugins"]
    assert [entry.name for entry in found] == ["atropos_engine_fork"]
    assert found[0].load() is plugin.fork_the_engine_core
