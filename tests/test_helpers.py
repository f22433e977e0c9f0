"""`free_port` never hands out a port twice in a test run, across the run's processes too: each
claims its ports in the folder tests/conftest.py shares with the pytest-xdist workers."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests import helpers
from tests.conftest import PORT_CLAIMS

ROOT = Path(__file__).resolve().parent.parent
# Another process of the run drawing from a range of one port.
DRAW_ONE = ("import sys; from tests import helpers; helpers._LOWEST = int(sys.argv[1]); "
            "helpers._ephemeral_start = lambda: int(sys.argv[1]) + 1; print(helpers.free_port())")


def bindable(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def test_a_port_another_process_of_the_run_drew_is_not_drawn_again(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(helpers.PORT_CLAIMS_VARIABLE, str(tmp_path))
    port = next(port for port in range(24000, 32000) if port not in helpers._HANDED_OUT and bindable(port))
    drawn = subprocess.run([sys.executable, "-c", DRAW_ONE, str(port)], cwd=ROOT, capture_output=True, text=True,
                           check=True, env=os.environ)
    assert int(drawn.stdout) == port and (tmp_path / str(port)).exists()
    monkeypatch.setattr(helpers, "_LOWEST", port)
    monkeypatch.setattr(helpers, "_ephemeral_start", lambda: port + 1)
    assert helpers.free_port() != port  # the only port of its range is taken: one the kernel picks


def test_the_run_shares_one_claims_folder_made_by_its_first_pytest() -> None:
    folder = Path(os.environ[helpers.PORT_CLAIMS_VARIABLE])
    assert folder.is_dir()
    # pytest-xdist's workers inherit the folder: only the process that made it removes it
    assert (PORT_CLAIMS == folder) == ("PYTEST_XDIST_WORKER" not in os.environ)
