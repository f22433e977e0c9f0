"""Slurm for the tests: Debian's ``slurm-wlm`` (installed when missing and possible), a
minimal slurm.conf for ``scontrol show hostnames``, and a real single-node cluster.

`SingleNodeCluster` runs a private ``munged`` (Slurm 22.05's ``auth/munge`` needs one),
``slurmctld`` and ``slurmd`` as root from a slurm.conf generated in a temporary folder: free
ports, state and spool folders in that folder, and plugins that need no cgroups
(``proctrack/linuxproc``, ``task/none``). The node is called ``localhost``, so the job's
node list is ``localhost`` and its servers are reachable on the loopback interface.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Callable, Optional

from tests.helpers import free_port

SLURM_COMMANDS = ("slurmctld", "slurmd", "sbatch", "scontrol", "squeue", "scancel", "munged")
APT_ENV = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
APT_INSTALL = ["apt-get", "install", "-y", "-q", "--no-install-recommends", "-o", "DPkg::Lock::Timeout=120",
               "slurm-wlm"]
FINISHED_STATES = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED",
                   "BOOT_FAIL", "DEADLINE"}


def slurm_missing_reason() -> Optional[str]:
    """None when Slurm's commands are on PATH, after installing ``slurm-wlm`` with apt-get
    if needed; otherwise why they are not (no root, no apt-get, the install failed)."""
    if all(shutil.which(command) for command in SLURM_COMMANDS):
        return None
    if os.geteuid() != 0:
        return "Slurm is not installed and installing it needs root (apt-get install slurm-wlm)"
    if shutil.which("apt-get") is None:
        return "Slurm is not installed and there is no apt-get to install slurm-wlm"
    attempt = subprocess.run(APT_INSTALL, env=APT_ENV, capture_output=True, text=True)
    if attempt.returncode != 0:
        subprocess.run(["apt-get", "update", "-q"], env=APT_ENV, capture_output=True, text=True)
        attempt = subprocess.run(APT_INSTALL, env=APT_ENV, capture_output=True, text=True)
    if attempt.returncode != 0:
        last = (attempt.stderr.strip() or attempt.stdout.strip() or "no output").splitlines()[-1]
        return f"apt-get install slurm-wlm failed: {last}"
    missing = [command for command in SLURM_COMMANDS if shutil.which(command) is None]
    return f"slurm-wlm installed but {', '.join(missing)} not on PATH" if missing else None


def write_client_conf(folder: Path) -> Path:
    """A slurm.conf with just what Slurm's client commands need to start (a cluster name
    and a controller host): enough for ``scontrol show hostnames``, no daemon behind it."""
    path = folder / "client-slurm.conf"
    path.write_text("ClusterName=atropos-tests\nSlurmctldHost=localhost\n")
    return path


class SingleNodeCluster:
    """munged + slurmctld + slurmd on this machine; a context manager that always stops them."""

    def __init__(self) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="atropos-slurm-"))
        self.root.chmod(0o755)  # munged wants its socket folder reachable by every user
        self.conf = self.root / "slurm.conf"
        self.socket = self.root / "munge.socket"
        self.processes: dict[str, subprocess.Popen[bytes]] = {}

    # -- the daemons -------------------------------------------------------------------
    def start(self) -> "SingleNodeCluster":
        try:
            self._start_munge()
            self._write_conf()
            self._spawn("slurmctld", ["slurmctld", "-D", "-i", "-f", str(self.conf)])
            self._until(lambda: "UP" in self._client("scontrol", "ping").stdout, "slurmctld answers scontrol ping")
            self._spawn("slurmd", ["slurmd", "-D", "-N", "localhost", "-f", str(self.conf)])
            self._until(lambda: self._client("sinfo", "--noheader", "--format=%T").stdout.strip() == "idle",
                        "the node is idle")
        except BaseException:
            self.stop()
            raise
        return self

    def _start_munge(self) -> None:
        key = self.root / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        self._spawn("munged", ["munged", "--foreground", "--force", f"--socket={self.socket}", f"--key-file={key}",
                               f"--pid-file={self.root / 'munged.pid'}", f"--seed-file={self.root / 'munged.seed'}",
                               f"--log-file={self.root / 'munged.log'}"])
        self._until(self.socket.exists, "munged creates its socket")

    def _write_conf(self) -> None:
        state, spool = self.root / "state", self.root / "spool"
        state.mkdir()
        spool.mkdir()
        self.conf.write_text("\n".join([
            "ClusterName=atropos-tests", "SlurmctldHost=localhost",
            f"SlurmctldPort={free_port()}", f"SlurmdPort={free_port()}",
            "SlurmUser=root", "SlurmdUser=root",
            "AuthType=auth/munge", "CredType=cred/munge", f"AuthInfo=socket={self.socket}",
            f"StateSaveLocation={state}", f"SlurmdSpoolDir={spool}",
            f"SlurmctldPidFile={self.root / 'slurmctld.pid'}", f"SlurmdPidFile={self.root / 'slurmd.pid'}",
            f"SlurmctldLogFile={self.root / 'slurmctld.log'}", f"SlurmdLogFile={self.root / 'slurmd.log'}",
            "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none", "JobAcctGatherType=jobacct_gather/none",
            "AccountingStorageType=accounting_storage/none", "JobCompType=jobcomp/none",
            "SchedulerType=sched/builtin", "SelectType=select/cons_tres", "SelectTypeParameters=CR_Core",
            "MpiDefault=none", "MailProg=/bin/true", "ReturnToService=2", "KillWait=10",
            f"NodeName=localhost CPUs={os.cpu_count() or 1} State=UNKNOWN",
            "PartitionName=debug Nodes=localhost Default=YES MaxTime=INFINITE State=UP",
        ]) + "\n")

    def _spawn(self, name: str, command: list[str]) -> None:
        log = open(self.root / f"{name}.out", "ab")
        self.processes[name] = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=self.environ())

    def _until(self, ready: Callable[[], bool], what: str, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while not ready():
            for name, process in self.processes.items():
                if process.poll() is not None:
                    raise RuntimeError(f"{name} exited with {process.returncode}: {self.log_tail(name)}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"Slurm test cluster: waited {timeout} s until {what}")
            time.sleep(0.2)

    def stop(self) -> None:
        """Cancel what still runs, stop slurmd, slurmctld and munged, remove the folder."""
        if "slurmctld" in self.processes and self.processes["slurmctld"].poll() is None:
            self._client("scancel", "--full", "--user=root")
        for name in ("slurmd", "slurmctld", "munged"):
            process = self.processes.get(name)
            if process is None or process.poll() is not None:
                continue
            process.terminate()
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(10)
        shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> "SingleNodeCluster":
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    # -- clients -----------------------------------------------------------------------
    def environ(self, **extra: str) -> dict[str, str]:
        """This process's environment, pointed at the cluster (SLURM_CONF), plus `extra`."""
        return {**os.environ, "SLURM_CONF": str(self.conf), **extra}

    def _client(self, *command: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(list(command), capture_output=True, text=True, env=self.environ(), timeout=60)

    def log_tail(self, name: str, lines: int = 20) -> str:
        path = self.root / f"{name}.out"
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:]) if path.exists() else ""

    def job(self, job_id: int) -> dict[str, str]:
        """The job's fields as ``scontrol show job`` reports them (JobState, ExitCode, ...)."""
        shown = self._client("scontrol", "show", "job", "--oneliner", str(job_id)).stdout
        return dict(re.findall(r"(\w+)=(\S*)", shown))

    def wait_for_job(self, job_id: int, timeout: float) -> dict[str, str]:
        """The job's fields once it has finished; TimeoutError (after cancelling it) if it
        has not within `timeout` seconds."""
        deadline = time.monotonic() + timeout
        while (fields := self.job(job_id)).get("JobState") not in FINISHED_STATES:
            if time.monotonic() > deadline:
                self._client("scancel", str(job_id))
                raise TimeoutError(f"job {job_id} still {fields.get('JobState')} after {timeout} s")
            time.sleep(0.5)
        return fields


def submitted_job_id(sbatch_output: str) -> int:
    """The job id in sbatch's ``Submitted batch job N``."""
    found = re.search(r"Submitted batch job (\d+)", sbatch_output)
    if found is None:
        raise ValueError(f"no job id in sbatch's output: {sbatch_output!r}")
    return int(found.group(1))
