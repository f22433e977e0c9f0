"""The suite's isolation and order: an API a test starts never restores what an earlier test left behind,
a process a test starts stops on SIGINT even when the suite was started in the background, and
the longest test files are handed out first."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests.conftest import LONGEST_FIRST, group, longest_first, registration, undo_ignored_sigint
from tests.helpers import ApiProcess, free_port

ROOT = Path(__file__).resolve().parent.parent
# Both tests use one port, as two tests of a long suite sometimes do by chance; they run in file order.
SHARED_PORT = free_port()


def test_an_api_on_a_port_leaves_its_default_state_behind() -> None:
    with ApiProcess(None, port=SHARED_PORT) as api:
        httpx.post(api.url + "/register", json=registration(batch_size=8)).raise_for_status()
        httpx.post(api.url + "/register-env", json={"max_token_length": 64, "desired_name": "env", "weight": 1.0,
                                                    "group_size": 8}).raise_for_status()
        httpx.post(api.url + "/scored_data", json=group(size=8)).raise_for_status()
        assert httpx.get(api.url + "/batch").json()["batch"]
        assert httpx.get(api.url + "/batches/served?since=0").json()["batches"]


def test_a_later_api_on_the_same_port_starts_fresh() -> None:
    with ApiProcess(None, port=SHARED_PORT) as api:
        assert httpx.get(api.url + "/batches/served?since=0").json()["batches"] == []
        assert httpx.get(api.url + "/status").json()["queue_size"] == 0


def test_processes_started_by_a_suite_that_inherited_sigint_ignored_stop_on_sigint() -> None:
    report = [sys.executable, "-c",
              "import signal; print(signal.getsignal(signal.SIGINT) is signal.default_int_handler)"]
    before = signal.signal(signal.SIGINT, signal.SIG_IGN)  # as `pytest &` or nohup leaves it
    try:
        assert subprocess.run(report, capture_output=True, text=True).stdout.strip() == "False"
        undo_ignored_sigint()
        assert subprocess.run(report, capture_output=True, text=True).stdout.strip() == "True"
    finally:
        signal.signal(signal.SIGINT, before)


class FakeItem:
    def __init__(self, nodeid: str, serial: bool = False) -> None:
        self.nodeid, self.serial = nodeid, serial

    def get_closest_marker(self, name: str) -> object:
        return pytest.mark.serial if name == "serial" and self.serial else None


def test_the_longest_files_come_first_and_the_rest_and_serial_tests_keep_their_order() -> None:
    items = [FakeItem("tests/a/test_one.py::test_x"), FakeItem("tests/test_readme_commands.py::test_b[bench-api]"),
             FakeItem("tests/example_trainer/test_trainers.py::test_y"), FakeItem("tests/b/test_two.py::test_z"),
             FakeItem("tests/test_readme_commands.py::test_quickstart", serial=True),
             FakeItem("tests/test_readme_commands.py::test_a"),
             FakeItem("tests/example_trainer/test_trainers.py_other::test_w")]
    assert [item.nodeid for item in longest_first(items)] == [  # type: ignore[arg-type]
        "tests/example_trainer/test_trainers.py::test_y",
        "tests/test_readme_commands.py::test_b[bench-api]", "tests/test_readme_commands.py::test_a",
        "tests/a/test_one.py::test_x", "tests/b/test_two.py::test_z", "tests/test_readme_commands.py::test_quickstart",
        "tests/example_trainer/test_trainers.py_other::test_w"]


@pytest.mark.parametrize("path", LONGEST_FIRST)
def test_each_longest_file_named_first_exists(path: str) -> None:
    assert (ROOT / path).is_file(), f"{path} is gone: take it out of LONGEST_FIRST"
