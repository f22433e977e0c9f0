"""The GPU smoke runs each check as a command that leads a process group of its own: a command
that overruns its limit is stopped whole, its children (torchrun's ranks) included, and one that
ignores SIGTERM is killed. The checks themselves run in tests/test_readme_commands.py."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from bench import gpu_smoke
from tests.local.stand_ins import all_gone, recorded_pids

# A parent that starts a child and sleeps: the child records its pid, then sleeps too, ignoring
# SIGTERM when asked to (a rank hung where no signal handler runs).
PARENT = """
import subprocess, sys, time
child = '''
import os, signal, sys, time
if sys.argv[2] == "ignore": signal.signal(signal.SIGTERM, signal.SIG_IGN)
open(sys.argv[1], "a").write(f"{os.getpid()} ")
time.sleep(600)
'''
subprocess.Popen([sys.executable, "-c", child, sys.argv[1], sys.argv[2]])
print("started", flush=True)
time.sleep(600)
"""


@pytest.mark.parametrize("child_on_sigterm", ["default", "ignore"])
def test_a_command_past_its_limit_is_stopped_with_its_children(child_on_sigterm: str, tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gpu_smoke, "STOP_GRACE", 1.0)
    pids = tmp_path / "pids"
    with pytest.raises(AssertionError) as failed:
        gpu_smoke.run([sys.executable, "-c", PARENT, str(pids), child_on_sigterm], tmp_path / "log", timeout=3)
    assert "started" in str(failed.value) and "stopped after its 3 s limit" in str(failed.value)
    assert "stopped after its 3 s limit" in (tmp_path / "log").read_text()
    all_gone(recorded_pids(pids, 1, timeout=1))


def test_a_command_that_succeeds_gives_its_output(tmp_path: Path) -> None:
    output = gpu_smoke.run([sys.executable, "-c", "print('PASS', flush=True)"], tmp_path / "log")
    assert output.strip() == "PASS" and (tmp_path / "log").read_text() == output
