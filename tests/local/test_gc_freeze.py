"""Commands freeze what their imports made once they are done importing; a program that calls
their ``main`` with arguments keeps its garbage collection as it was."""

from __future__ import annotations

import gc
import sys
from pathlib import Path
from typing import Callable, Iterator

import pytest

from atroposlib.cli import run_api
from atroposlib.envs import runner
from atroposlib.local.gc_freeze import freeze_imports
from environments.arithmetic_env import ArithmeticEnv
from tests.helpers import free_port


@pytest.fixture(autouse=True)
def unfrozen() -> Iterator[None]:
    """Each test starts and ends with nothing frozen, as the worker it runs in expects."""
    gc.unfreeze()
    yield
    gc.unfreeze()


def frozen_by(call: Callable[[], object]) -> int:
    """How many objects `call` froze; an exit it raises (a command's ending) is caught."""
    before = gc.get_freeze_count()
    try:
        call()
    except SystemExit:
        pass
    return gc.get_freeze_count() - before


def test_freeze_imports_moves_what_is_alive_out_of_the_collectors_reach() -> None:
    alive = [object() for _ in range(10)]
    assert frozen_by(freeze_imports) >= len(alive)


def test_run_api_freezes_as_a_command_only(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(run_api.uvicorn, "run", lambda app, **settings: None)
    argv = ["--port", str(free_port()), "--ephemeral"]
    assert frozen_by(lambda: run_api.main(argv)) == 0
    monkeypatch.setattr(sys, "argv", ["run-api", *argv])
    assert frozen_by(run_api.main) > 0


def test_an_environment_freezes_as_a_command_only(monkeypatch: pytest.MonkeyPatch) -> None:
    argv = ["process", "--env.no_such_flag", "1"]  # exits 2 once the flags are read
    assert frozen_by(lambda: runner.main(ArithmeticEnv, argv)) == 0
    monkeypatch.setattr(sys, "argv", ["arithmetic_env.py", *argv])
    assert frozen_by(ArithmeticEnv.cli) > 0


def test_the_trainer_freezes_as_a_command_only(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from example_trainer import grpo

    monkeypatch.setattr(grpo, "restart_with_fast_allocator", lambda allocator, device: None)
    argv = ["--model-name", str(tmp_path / "no-model"), "--device", "cpu", "--atropos-url", "http://127.0.0.1:1"]
    assert frozen_by(lambda: grpo.main(argv)) == 0  # fails in one line: no model folder
    monkeypatch.setattr(sys, "argv", ["atropos-grpo", *argv])
    assert frozen_by(grpo.main) > 0
