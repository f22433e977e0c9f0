"""`run-api` as a user runs it: real processes on free loopback ports."""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path

import httpx
import pytest

from tests.conftest import env_registration, group, registration
from tests.helpers import ApiProcess, free_port

pytestmark = pytest.mark.slow


def _start_run(url: str, batch_size: int = 8) -> None:
    httpx.post(url + "/register", json=registration(batch_size)).raise_for_status()
    httpx.get(url + "/batch").raise_for_status()
    assert httpx.post(url + "/register-env", json=env_registration("e", 8)).json()["status"] == "success"


def _drain(url: str) -> list[float]:
    """Pop every batch; return the first score of every group served (the group's id)."""
    ids: list[float] = []
    while True:
        batch = httpx.get(url + "/batch", timeout=30).json()["batch"]
        if batch is None:
            return ids
        ids += [item["scores"][0] for item in batch]


def test_module_entry_point_serves_reference_probe(tmp_path: Path) -> None:
    with ApiProcess(tmp_path / "state") as api:
        assert httpx.get(api.url + "/info").json() == {"batch_size": -1, "max_token_len": -1}
        assert httpx.get(api.url + "/health").json()["durable"] is True


def test_state_and_a_lease_within_its_time_survive_a_restart(tmp_path: Path) -> None:
    state_dir = tmp_path / "state"
    with ApiProcess(state_dir) as api:
        _start_run(api.url)
        for score in range(3):
            httpx.post(api.url + "/scored_data", json=group(8, env_id=0, score=score)).raise_for_status()
        assert httpx.get(api.url + "/batch").json()["batch"][0]["scores"][0] == 0
        leased = httpx.post(api.url + "/batch").json()
        assert leased["batch"][0]["scores"][0] == 1
        api.kill9()
    with ApiProcess(state_dir, port=api.port) as again:
        status = httpx.get(again.url + "/status").json()
        assert (status["current_step"], status["queue_size"]) == (1, 2)
        assert httpx.get(again.url + "/info").json()["batch_size"] == 8
        assert httpx.get(again.url + "/envs").json()["envs"][0]["real_name"] == "e_0"
        late = httpx.post(f"{again.url}/batch/{leased['batch_id']}/ack")  # its consumer rode out the restart
        assert late.json() == {"status": "acked", "current_step": 2}
        assert _drain(again.url) == [2]  # the leased group was not served again
        assert "RESTORED RUN STATE" in again.log()


def test_kill_9_under_load_loses_no_acknowledged_group(tmp_path: Path) -> None:
    state_dir = tmp_path / "state"
    acknowledged: list[int] = []
    lock = threading.Lock()
    stop = threading.Event()
    with ApiProcess(state_dir) as api:
        _start_run(api.url)
        counter = iter(range(10**6))

        def producer() -> None:
            with httpx.Client(timeout=5) as client:
                while not stop.is_set():
                    with lock:
                        ident = next(counter)
                    try:
                        response = client.post(api.url + "/scored_data", json=group(8, env_id=0, length=64, score=ident))
                    except httpx.HTTPError:
                        return
                    if response.status_code == 200:
                        with lock:
                            acknowledged.append(ident)

        threads = [threading.Thread(target=producer) for _ in range(4)]
        for thread in threads:
            thread.start()
        while len(acknowledged) < 200:
            threading.Event().wait(0.05)
        api.kill9()
        stop.set()
        for thread in threads:
            thread.join(10)
    with ApiProcess(state_dir, port=api.port) as again:
        served = _drain(again.url)
    assert len(served) == len(set(served)), "a group was served twice"
    missing = set(acknowledged) - set(served)
    assert not missing, f"{len(missing)} acknowledged groups lost"
    assert len(acknowledged) >= 200


def test_second_server_on_the_same_state_dir_fails_fast(tmp_path: Path) -> None:
    state_dir = tmp_path / "state"
    with ApiProcess(state_dir):
        result = subprocess.run(
            [sys.executable, "-m", "atroposlib.cli.run_api", "--port", str(free_port()), "--state-dir", str(state_dir)],
            capture_output=True, text=True, timeout=30,
        )
    assert result.returncode != 0 and "another run-api process" in result.stderr


def test_a_port_in_use_fails_in_one_line_before_uvicorn_starts(tmp_path: Path) -> None:
    with ApiProcess(tmp_path / "first") as first:
        result = subprocess.run(
            [sys.executable, "-m", "atroposlib.cli.run_api", "--port", str(first.port), "--state-dir",
             str(tmp_path / "second")], capture_output=True, text=True, timeout=30,
        )
    assert result.returncode == 1 and result.stdout == ""
    assert result.stderr.strip().splitlines() == [
        f"run-api: cannot listen on 127.0.0.1:{first.port}: Address already in use. Stop what uses the port, "
        "or pick another --port."]


def test_fresh_discards_and_ephemeral_keeps_nothing(tmp_path: Path) -> None:
    state_dir = tmp_path / "state"
    with ApiProcess(state_dir) as api:
        httpx.post(api.url + "/scored_data", json=group(8)).raise_for_status()
    with ApiProcess(state_dir, "--fresh", port=api.port) as fresh:
        assert httpx.get(fresh.url + "/status").json()["queue_size"] == 0
    with ApiProcess(None, "--ephemeral") as ephemeral:
        assert httpx.get(ephemeral.url + "/health").json()["durable"] is False
        assert "not durable" in ephemeral.log() or "in memory only" in ephemeral.log()


def test_non_loopback_bind_without_key_warns(tmp_path: Path) -> None:
    with ApiProcess(tmp_path / "state", "--host", "0.0.0.0") as api:
        assert "without --api-key" in api.log()
    with ApiProcess(tmp_path / "state2", "--api-key", "k") as api:
        assert httpx.get(api.url + "/info").status_code == 401
        assert httpx.get(api.url + "/info", headers={"Authorization": "Bearer k"}).status_code == 200


def test_help_states_each_default_once() -> None:
    from atroposlib.cli.run_api import build_parser

    text = build_parser().format_help()
    options = text.split("\n  --")[1:]
    assert options and all(option.count("(default") <= 1 for option in options), text
    assert "(default: None)" not in text and "(default: False)" not in text
    assert "(default: 8000)" in text
