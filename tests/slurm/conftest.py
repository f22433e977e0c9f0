"""Fixtures of the Slurm tests: Slurm's client commands with a minimal slurm.conf."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.slurm.cluster import slurm_missing_reason, write_client_conf


@pytest.fixture(scope="session")
def slurm_client_conf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A slurm.conf that lets ``scontrol show hostnames`` run (no daemon behind it);
    the tests using it skip, with the reason, where Slurm cannot be installed."""
    reason = slurm_missing_reason()
    if reason is not None:
        pytest.skip(reason)
    return write_client_conf(tmp_path_factory.mktemp("slurm-client"))


@pytest.fixture
def scontrol(slurm_client_conf: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """``SLURM_CONF`` of this test points at the minimal slurm.conf."""
    monkeypatch.setenv("SLURM_CONF", str(slurm_client_conf))
    return slurm_client_conf
