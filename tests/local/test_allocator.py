"""The fast allocator: found, preloaded into a restarted process once, passed to vLLM, and
left alone where it must be (the system's asked for, a GPU, one already preloaded)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from atroposlib.local import allocator
from atroposlib.local.allocator import (ALLOCATOR_ENV, AllocatorNotFoundError, describe_allocator, find_library,
                                        loaded_allocator, restart_with_fast_allocator, with_fast_allocator)
from atroposlib.local.vllm_service import LocalVLLM

TCMALLOC = find_library()
needs_tcmalloc = pytest.mark.skipif(TCMALLOC is None, reason="libtcmalloc-minimal4 is not installed")

# a program that asks for the restart, then reports what it runs with
REPORT = ("import json, os, sys\n"
          "from atroposlib.local.allocator import loaded_allocator, restart_with_fast_allocator\n"
          "print('started', flush=True)\n"
          "restart_with_fast_allocator(sys.argv[1], sys.argv[2])\n"
          "print(json.dumps({'pid': os.getpid(), 'loaded': loaded_allocator(), 'argv': sys.argv[1:],\n"
          "                  'preload': os.environ.get('LD_PRELOAD', '')}))\n")


def run_report(*args: str, env: dict[str, str] | None = None) -> tuple[int, dict[str, object]]:
    """How many times the program started, and what it reported at the end."""
    base = {key: value for key, value in __import__("os").environ.items()
            if key not in ("LD_PRELOAD", ALLOCATOR_ENV)}
    done = subprocess.run([sys.executable, "-c", REPORT, *args], capture_output=True, text=True, timeout=120,
                          env=base | (env or {}), check=True)
    lines = done.stdout.splitlines()
    return lines.count("started"), json.loads(lines[-1])


@needs_tcmalloc
def test_a_cpu_process_restarts_once_with_tcmalloc_and_its_arguments() -> None:
    starts, report = run_report("auto", "cpu")
    assert starts == 2
    assert "libtcmalloc" in str(report["loaded"])
    assert report["argv"] == ["auto", "cpu"]


@pytest.mark.parametrize("args", [("system", "cpu"), ("auto", "cuda:0")])
def test_the_system_allocator_or_a_gpu_run_starts_once_with_nothing_preloaded(args: tuple[str, str]) -> None:
    starts, report = run_report(*args)
    assert (starts, report["loaded"], report["preload"]) == (1, None, "")


@needs_tcmalloc
def test_an_allocator_the_user_preloaded_is_kept() -> None:
    starts, report = run_report("auto", "cpu", env={"LD_PRELOAD": str(TCMALLOC)})
    assert starts == 1 and "libtcmalloc" in str(report["loaded"])


def test_a_named_allocator_that_is_missing_is_an_error_naming_the_package(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ALLOCATOR_ENV, raising=False)
    monkeypatch.setattr(allocator, "loaded_allocator", lambda: None)
    monkeypatch.setattr(allocator.ctypes.util, "find_library", lambda name: None)
    with pytest.raises(AllocatorNotFoundError, match="libtcmalloc-minimal4"):
        restart_with_fast_allocator("tcmalloc", "cpu")
    restart_with_fast_allocator("auto", "cpu")  # auto without it: the system's, no error
    assert "install libtcmalloc-minimal4 (apt)" in describe_allocator("auto", "cpu")


def test_the_minimal_tcmalloc_is_preferred_then_the_full_one(monkeypatch: pytest.MonkeyPatch) -> None:
    installed = {"tcmalloc_minimal": "libtcmalloc_minimal.so.4", "tcmalloc": "libtcmalloc.so.4",
                 "jemalloc": "libjemalloc.so.2"}
    monkeypatch.setattr(allocator.ctypes.util, "find_library", installed.get)
    assert find_library() == "libtcmalloc_minimal.so.4"
    del installed["tcmalloc_minimal"]
    assert find_library() == "libtcmalloc.so.4"
    del installed["tcmalloc"]
    assert find_library() is None  # jemalloc with its defaults was slower than glibc (bench/allocator.py)


def test_the_preload_goes_first_once_and_never_beside_another_allocator() -> None:
    assert with_fast_allocator({"LD_PRELOAD": "/torch/lib/libgomp.so"}, "libtcmalloc_minimal.so.4")["LD_PRELOAD"] \
        == "libtcmalloc_minimal.so.4:/torch/lib/libgomp.so"
    assert with_fast_allocator({}, "libtcmalloc_minimal.so.4") == {"LD_PRELOAD": "libtcmalloc_minimal.so.4"}
    assert with_fast_allocator({"LD_PRELOAD": "/opt/libjemalloc.so.2"}, "libtcmalloc_minimal.so.4") \
        == {"LD_PRELOAD": "/opt/libjemalloc.so.2"}
    assert with_fast_allocator({"A": "1"}, None) == {"A": "1"}


def test_the_loaded_allocator_is_read_from_the_memory_map(tmp_path: Path) -> None:
    maps = tmp_path / "maps"
    maps.write_text("7f00-7f01 r-xp 00000000 08:01 123 /usr/lib/x86_64-linux-gnu/libc.so.6\n"
                    "7f02-7f03 r-xp 00000000 08:01 124 /usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4.5.10\n")
    assert loaded_allocator(maps) == "/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4.5.10"
    assert loaded_allocator(tmp_path / "missing") is None


def test_a_cpu_vllm_server_gets_the_allocator_unless_the_system_one_is_asked_for(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("LD_PRELOAD", raising=False)
    monkeypatch.setattr("atroposlib.local.vllm_service.find_library", lambda: "libtcmalloc_minimal.so.4")
    server = LocalVLLM(tmp_path, port=1, python=Path(sys.executable))
    server.gpu = False
    assert server.environment()["LD_PRELOAD"] == "libtcmalloc_minimal.so.4"
    server.allocator = "system"
    assert "LD_PRELOAD" not in server.environment()
