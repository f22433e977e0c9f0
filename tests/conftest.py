"""Shared fixtures: in-process API clients with a controllable clock, and payload makers."""

from __future__ import annotations

import gc
import os
import shutil
import signal
import tempfile
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

import pytest
from fastapi.testclient import TestClient

from atroposlib.api import ApiSettings, create_app
from atroposlib.local.paths import atropos_home
from tests.browser import browser  # noqa: F401 (fixtures registered once, for every test directory)
from tests.helpers import PORT_CLAIMS_VARIABLE
from tests.real_engine import EarlyEngines, gsm8k_data, real_model_dir, real_vllm  # noqa: F401

os.environ.setdefault("WANDB_MODE", "disabled")


def undo_ignored_sigint() -> None:
    """A suite started in the background (`cmd &`, nohup, some CI runners) inherits SIGINT
    ignored, and so would every process a test starts: a Ctrl-C sent to stop one would do
    nothing and the test would wait out its grace period (minutes, over the suite). A handler
    here, which exec resets to the default, undoes that for every process started after."""
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


undo_ignored_sigint()


def share_port_claims() -> Optional[Path]:
    """The folder in which the test run's processes claim the ports they hand out
    (`tests.helpers.free_port`), made here unless the pytest that started this one made it
    (pytest-xdist's workers inherit it); returned when made here."""
    if os.environ.get(PORT_CLAIMS_VARIABLE):
        return None
    folder = Path(tempfile.mkdtemp(prefix="atropos-test-ports-"))
    os.environ[PORT_CLAIMS_VARIABLE] = str(folder)
    return folder


PORT_CLAIMS = share_port_claims()

# Set by scripts/test.sh in CI, where every component the tests need is installed: a test that
# skips (a missing engine, browser, Slurm, reference install...) fails instead of hiding it.
NO_SKIPS_VARIABLE = "ATROPOS_TESTS_NO_SKIP"


def _fail_skip(report: Any) -> None:
    if os.environ.get(NO_SKIPS_VARIABLE) == "1" and report.skipped and not hasattr(report, "wasxfail"):
        reason = report.longrepr[-1] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        report.outcome = "failed"
        report.longrepr = f"skipped with {NO_SKIPS_VARIABLE}=1 (a component the tests need is missing): {reason}"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--launch-engine-early", action="store_true",
                     help="launch the shared real vLLM engines before collecting (one process, no -n): "
                          "scripts/test.sh's serial part, whose tests use them")


def pytest_sessionstart(session: pytest.Session) -> None:
    if session.config.getoption("--launch-engine-early"):
        EarlyEngines.launch()


def pytest_sessionfinish(session: pytest.Session) -> None:
    EarlyEngines.stop()


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config: pytest.Config) -> None:
    """A pytest process that ran hundreds of tests holds about a million objects, which the
    interpreter's exit scans for cycles again and again: 10-30 s of 4 workers on 2 cores once the
    last test has passed, with nothing left to report. Frozen, they are left to the OS instead.
    The port claims go with the process that made them."""
    if PORT_CLAIMS is not None:
        shutil.rmtree(PORT_CLAIMS, ignore_errors=True)
    gc.freeze()


# The parallel part's longest test files (40-170 s of a worker's time each on 2 cores), longest
# first. Handed out in file order, tests/test_readme_commands.py (the GPU smoke, the scaled-down
# benchmarks) came last, and its longest test ran alone for its last half minute.
LONGEST_FIRST = (
    "tests/example_trainer/test_trainers.py",
    "tests/envs/test_modes.py",
    "tests/test_readme_commands.py",
    "tests/example_trainer/test_distributed.py",
    "tests/cli/test_dataset_tools.py",
    "tests/api/test_schemathesis.py",
    "tests/cli/test_view_run.py",
    "tests/envs/test_fresh_install.py",
    "tests/slurm/test_job.py",
    "tests/envs/test_serve_signals.py",
    "tests/cli/test_run_api.py",
)


def longest_first(items: list[pytest.Item]) -> list[pytest.Item]:
    """`items` with the tests of the `LONGEST_FIRST` files first, file by file in its order, then the
    rest in theirs. scripts/test.sh's workers take whole files (``--dist loadfile``) in this order,
    so the long ones start early and the short ones even out the workers' ends. `serial` tests keep
    their places: their part runs first what uses the engines it launched early."""
    rank = {path: index for index, path in enumerate(LONGEST_FIRST)}
    last = len(LONGEST_FIRST)

    def place(item: pytest.Item) -> int:
        if item.get_closest_marker("serial") is not None:
            return last
        return rank.get(item.nodeid.split("::", 1)[0], last)

    return sorted(items, key=place)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Tests on the real engine run in one process (they share one engine, `tests.real_engine`),
    so they are `serial` too: scripts/test.sh runs those after the parallel part, one at a time.
    The longest tests come first (`longest_first`)."""
    for item in items:
        if item.get_closest_marker("real_vllm") is not None and item.get_closest_marker("serial") is None:
            item.add_marker(pytest.mark.serial)
    items[:] = longest_first(items)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> Iterator[None]:
    outcome = yield
    _fail_skip(outcome.get_result())


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector: pytest.Collector) -> Iterator[None]:
    outcome = yield
    _fail_skip(outcome.get_result())


@pytest.fixture(scope="session", autouse=True)
def _session_user_data_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """`run-api` keeps its state under the user data dir by port (``port-<port>``) unless told
    otherwise, and ports come round again over a suite: each session, then each test (below),
    gets a data dir of its own, so no API restores the state an earlier test left on its port."""
    os.environ.setdefault("ATROPOS_HOME", str(atropos_home()))  # installed models and runtimes stay found
    previous = os.environ.get("XDG_DATA_HOME")
    os.environ["XDG_DATA_HOME"] = str(tmp_path_factory.mktemp("user-data"))
    yield
    if previous is None:
        os.environ.pop("XDG_DATA_HOME", None)
    else:
        os.environ["XDG_DATA_HOME"] = previous


@pytest.fixture(autouse=True)
def _test_user_data_dir(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path_factory.mktemp("user-data")))


class FakeClock:
    """Seconds that only move when a test says so."""

    def __init__(self, start: float = 1_000_000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def registration(batch_size: int = 32, **overrides: Any) -> dict[str, Any]:
    body = {
        "wandb_group": "group", "wandb_project": "project", "batch_size": batch_size,
        "max_token_len": 2048, "checkpoint_dir": "checkpoints/run", "save_checkpoint_interval": 10,
        "starting_step": 0, "num_steps": 100,
    }
    body.update(overrides)
    return body


def env_registration(name: str = "env", group_size: int = 8, **overrides: Any) -> dict[str, Any]:
    body = {"max_token_length": 1024, "desired_name": name, "weight": 1.0, "group_size": group_size}
    body.update(overrides)
    return body


def group(size: int = 8, env_id: Optional[int] = None, length: int = 4, score: float = 1.0,
          **extra: Any) -> dict[str, Any]:
    """A consistent scored group of `size` sequences of `length` tokens."""
    body = {
        "tokens": [[i + 1] * length for i in range(size)],
        "masks": [[-100] + [i + 1] * (length - 1) for i in range(size)],
        "scores": [score] * size,
    }
    if env_id is not None:
        body["env_id"] = env_id
    body.update(extra)
    return body


@pytest.fixture(scope="session")
def tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small transformers tokenizer folder with a chat template (built offline)."""
    from tests.tokenizer_fixture import build_tokenizer

    return build_tokenizer(tmp_path_factory.mktemp("tokenizer"))


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def make_client(clock: FakeClock) -> Iterator[Callable[..., TestClient]]:
    """``make_client(**settings)``: an in-process server (in-memory state unless a state_dir is given)."""
    clients: list[TestClient] = []

    def make(**settings: Any) -> TestClient:
        settings.setdefault("ephemeral", "state_dir" not in settings)
        # Worker processes only where a test asks for them: each costs half a second of CPU.
        settings.setdefault("validation_workers", 0)
        client = TestClient(create_app(ApiSettings(**settings), clock=clock))
        client.__enter__()
        clients.append(client)
        return client

    yield make
    for client in clients:
        client.__exit__(None, None, None)


@pytest.fixture
def client(make_client: Callable[..., TestClient]) -> TestClient:
    return make_client()


def start_run(client: TestClient, batch_size: int = 32, envs: tuple[tuple[str, int], ...] = (("env", 8),),
              **env_fields: Any) -> list[int]:
    """Register a trainer, open the gate with one /batch poll, register envs; return env ids."""
    assert client.post("/register", json=registration(batch_size)).status_code == 200
    client.get("/batch")
    ids = []
    for name, size in envs:
        response = client.post("/register-env", json=env_registration(name, size, **env_fields)).json()
        ids.append(response["env_id"])
    return ids
