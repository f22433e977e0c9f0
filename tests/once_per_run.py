"""Work that the tests of a whole run share, done once however many pytest-xdist workers need it.

A module-scoped fixture runs again in every worker that gets one of its module's tests (and
again whenever a worker comes back to the module), so an expensive one is paid several times.
`made_once` makes a folder in the directory all workers of the run share instead: the first
worker to ask fills it while the others wait on a lock, and the rest find it done.
"""

from __future__ import annotations

import fcntl
import os
import shutil
from pathlib import Path
from typing import Callable

import pytest


def made_once(tmp_path_factory: pytest.TempPathFactory, name: str, make: Callable[[Path], None]) -> Path:
    """The folder `name`, which `make` has filled once in this test run. A `make` that raised is
    tried again by the next test that asks (and fails that test too, with its own error)."""
    shared = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        shared = shared.parent  # each worker's base temp is a folder of the run's
    folder = shared / name
    with open(shared / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (folder / ".made").exists():
            shutil.rmtree(folder, ignore_errors=True)  # what a `make` that raised left
            folder.mkdir()
            make(folder)
            (folder / ".made").touch()
    return folder
