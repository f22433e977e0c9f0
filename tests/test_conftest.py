"""The suite's isolation: an API a test starts never restores what an earlier test left behind,
and a process a test starts stops on SIGINT even when the suite was started in the background."""

from __future__ import annotations

import signal
import subprocess
import sys

import httpx

from tests.conftest import group, registration, undo_ignored_sigint
from tests.helpers import ApiProcess, free_port

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
