"""The suite-wide real engine's start: a timeout that grows on a small or busy machine, one
retry that says why instead of failing every test that shares the engine, and the early
launch (``--launch-engine-early``) that the fixture takes over or the session's end stops."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from atroposlib.local.paths import default_model_dir
from atroposlib.local.prepare_model import READY_MARKER
from atroposlib.local.vllm_service import VLLMStartError
from tests.local.stand_ins import all_gone, model_folder, running, stand_in_runtime
from tests.real_engine import (
    BASE_START_TIMEOUT,
    MAX_START_TIMEOUT,
    BundledServerStart,
    EarlyEngines,
    Launched,
    start_timeout,
    start_with_one_retry,
)


class StandInServer:
    """Starts, or fails the way `LocalVLLM.start` does, as its script says."""

    def __init__(self, failure: str = "") -> None:
        self.failure = failure
        self.timeouts: list[float] = []

    def start(self, timeout: float) -> Any:
        self.timeouts.append(timeout)
        if self.failure:
            raise VLLMStartError(f"{self.failure}; last log lines:\nINFO loading weights")
        return self


def servers(*failures: str) -> tuple[list[StandInServer], Any]:
    made: list[StandInServer] = []
    script = iter(failures)

    def make() -> StandInServer:
        made.append(StandInServer(next(script)))
        return made[-1]

    return made, make


def test_the_timeout_grows_with_fewer_and_busier_cores() -> None:
    assert start_timeout(cores=8, load=0.5) == BASE_START_TIMEOUT
    assert start_timeout(cores=2, load=1.0) == 2 * BASE_START_TIMEOUT
    assert start_timeout(cores=2, load=3.0) == 3 * BASE_START_TIMEOUT
    assert start_timeout(cores=1, load=8.0) == MAX_START_TIMEOUT


def test_a_first_start_that_fails_costs_one_line_and_one_retry() -> None:
    made, make = servers("vLLM did not answer within 300 s", "")
    said: list[str] = []
    server = start_with_one_retry(make, 300.0, said.append)
    assert server is made[1] and len(made) == 2
    assert [m.timeouts for m in made] == [[300.0], [600.0]]
    assert said == ["the real vLLM engine did not start (vLLM did not answer within 300 s): "
                    "trying once more, with 600 s"]


def test_a_start_that_works_is_not_retried() -> None:
    made, make = servers("")
    said: list[str] = []
    assert start_with_one_retry(make, 300.0, said.append) is made[0]
    assert len(made) == 1 and said == []


def test_two_failed_starts_raise_naming_both() -> None:
    _, make = servers("vLLM did not answer within 300 s", "vLLM exited with code 1")
    with pytest.raises(VLLMStartError, match="first vLLM did not answer within 300 s, then vLLM exited with code 1"):
        start_with_one_retry(make, 300.0, lambda line: None)


def test_the_trainers_bundled_server_gets_the_same_one_retry() -> None:
    class Manager:
        def __init__(self) -> None:
            self.starts: list[tuple[str, float]] = []

        def start(self, model: str, timeout: float) -> None:
            self.starts.append((model, timeout))
            if len(self.starts) == 1:
                raise VLLMStartError("vLLM exited with code 1; last log lines:\nINFO loading weights")

    manager = Manager()
    said: list[str] = []
    assert start_with_one_retry(lambda: BundledServerStart(manager, "model"), 300.0, said.append) is manager
    assert manager.starts == [("model", 300.0), ("model", 600.0)]
    assert said == ["the real vLLM engine did not start (vLLM exited with code 1): trying once more, with 600 s"]


@pytest.fixture
def stand_in_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """ATROPOS_HOME with a stand-in vLLM runtime installed; the bundled model not prepared yet."""
    monkeypatch.setenv("ATROPOS_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("ATROPOS_VLLM_RUNTIME", str(stand_in_runtime(tmp_path).path))
    monkeypatch.setenv("STAND_IN_PIDS", str(tmp_path / "pids"))
    return tmp_path / "home"


def prepared_model() -> Path:
    folder = model_folder(default_model_dir())
    (folder / READY_MARKER).write_text("{}")
    return folder


def test_the_fixtures_take_over_the_early_engines_and_wait_for_them(stand_in_home: Path) -> None:
    model_dir = prepared_model()
    EarlyEngines.launch()
    stock, bundled = EarlyEngines.take_stock(model_dir), EarlyEngines.take_bundled(model_dir)
    try:
        assert stock is not None and stock.process is not None and bundled is not None
        assert EarlyEngines.stock is None and EarlyEngines.bundled is None
        assert Launched(stock).start(60.0) is stock and running(stock.process.pid)
        assert BundledServerStart(bundled, str(model_dir)).start(60.0) is bundled and bundled.is_running()
    finally:
        for server in (stock, bundled):
            if server is not None:
                server.stop()


def test_early_engines_nobody_takes_are_stopped(stand_in_home: Path) -> None:
    prepared_model()
    EarlyEngines.launch()
    stock, bundled = EarlyEngines.stock, EarlyEngines.bundled
    assert stock is not None and stock.process is not None and bundled is not None and bundled.server is not None
    pids = [stock.process.pid, bundled.server.process.pid]
    EarlyEngines.stop()
    all_gone(pids)
    assert EarlyEngines.stock is None and EarlyEngines.bundled is None


def test_early_engines_on_another_model_are_stopped_not_taken(stand_in_home: Path, tmp_path: Path) -> None:
    prepared_model()
    EarlyEngines.launch()
    stock, bundled = EarlyEngines.stock, EarlyEngines.bundled
    assert stock is not None and stock.process is not None and bundled is not None and bundled.server is not None
    pids = [stock.process.pid, bundled.server.process.pid]
    assert EarlyEngines.take_stock(tmp_path / "another-model") is None
    assert EarlyEngines.take_bundled(tmp_path / "another-model") is None
    all_gone(pids)


def test_without_a_prepared_model_nothing_is_launched_early(stand_in_home: Path) -> None:
    EarlyEngines.launch()
    assert EarlyEngines.stock is None and EarlyEngines.bundled is None
