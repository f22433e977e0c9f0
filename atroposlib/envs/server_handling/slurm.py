"""Slurm discovery: the inference servers of a Slurm job, found from its node list.

A Slurm job running Atropos keeps its first ``NUM_TRAINING_NODES`` nodes for the trainer
and the trajectory API and runs vLLM on the others: ``8 // INFER_TP`` servers per node
(``INFER_TP`` GPUs each), listening on ports ``INFER_FIRST_PORT`` (9000) and up. The node
list is ``$SLURM_JOB_NODELIST`` expanded by ``scontrol show hostnames``.
`slurm_inference_urls` turns that into the servers' URLs; ``ServerManager(configs,
slurm=True)`` uses them. Each variable is checked with a one-line `SlurmDiscoveryError`
naming it (Atropos divided by the string ``INFER_TP`` and called ``int(None)``).
"""

from __future__ import annotations

import logging
import os
import shlex
import shutil
import subprocess
from dataclasses import dataclass
from typing import Mapping, Optional

log = logging.getLogger("atroposlib.inference")

GPUS_PER_NODE = 8
DEFAULT_FIRST_PORT = 9000
TENSOR_PARALLEL_SIZES = (1, 2, 4, 8)
NODELIST_VARIABLE = "SLURM_JOB_NODELIST"
TRAINING_NODES_VARIABLE = "NUM_TRAINING_NODES"
TENSOR_PARALLEL_VARIABLE = "INFER_TP"
FIRST_PORT_VARIABLE = "INFER_FIRST_PORT"


class SlurmDiscoveryError(ValueError):
    """The job's node list or a Slurm variable cannot give the inference servers; the
    message names the variable or the command and says what is expected."""


@dataclass(frozen=True)
class SlurmLayout:
    """Where a Slurm job's inference servers are: every host after the training ones runs
    ``8 // tensor_parallel`` servers on consecutive ports from ``first_port``."""

    hosts: tuple[str, ...]
    training_nodes: int
    tensor_parallel: int
    first_port: int

    @property
    def servers_per_node(self) -> int:
        return GPUS_PER_NODE // self.tensor_parallel

    @property
    def inference_hosts(self) -> tuple[str, ...]:
        return self.hosts[self.training_nodes:]

    def urls(self) -> list[str]:
        ports = range(self.first_port, self.first_port + self.servers_per_node)
        return [f"http://{host}:{port}/v1" for host in self.inference_hosts for port in ports]


def job_hostnames(nodelist: str) -> list[str]:
    """The host names of a Slurm node list (``node[01-03],gpu7``), one per node, in order,
    as ``scontrol show hostnames`` prints them. scontrol needs the cluster's slurm.conf
    (``$SLURM_CONF`` or the default path), not a running controller."""
    if shutil.which("scontrol") is None:
        raise SlurmDiscoveryError(
            f"{NODELIST_VARIABLE} is set but scontrol is not on PATH: it expands the node list "
            "(run inside the Slurm job with Slurm's client commands installed, or leave --slurm off)")
    result = subprocess.run(["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True)
    if result.returncode != 0:
        reason = result.stderr.strip().splitlines()[-1] if result.stderr.strip() else f"exit status {result.returncode}"
        raise SlurmDiscoveryError(f"scontrol show hostnames {shlex.quote(nodelist)} failed: {reason}")
    return [line.strip() for line in result.stdout.splitlines() if line.strip()]


def _whole_number(environ: Mapping[str, str], name: str, default: int, meaning: str) -> int:
    raw = environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        return int(raw.strip())
    except ValueError:
        raise SlurmDiscoveryError(f"{name}={raw!r} is not a whole number ({meaning})") from None


def read_layout(hosts: list[str], environ: Mapping[str, str]) -> SlurmLayout:
    """The layout of a job on `hosts` (two or more) described by `environ`'s
    ``NUM_TRAINING_NODES`` (default 1, with a warning), ``INFER_TP`` (default 1) and
    ``INFER_FIRST_PORT`` (default 9000)."""
    if environ.get(TRAINING_NODES_VARIABLE) is None:
        log.warning("%s is not set: assuming 1 training node (inference servers on the job's other %d nodes)",
                    TRAINING_NODES_VARIABLE, len(hosts) - 1)
    training = _whole_number(environ, TRAINING_NODES_VARIABLE, 1, "the job's leading nodes kept for the trainer")
    if not 0 <= training < len(hosts):
        raise SlurmDiscoveryError(
            f"{TRAINING_NODES_VARIABLE}={training} does not fit the job's {len(hosts)} nodes ({', '.join(hosts)}): "
            f"use 0 to {len(hosts) - 1} (leading nodes kept for the trainer; the others run inference servers)")
    tensor_parallel = _whole_number(environ, TENSOR_PARALLEL_VARIABLE, 1, "GPUs per inference server")
    if tensor_parallel not in TENSOR_PARALLEL_SIZES:
        raise SlurmDiscoveryError(
            f"{TENSOR_PARALLEL_VARIABLE}={tensor_parallel} does not divide a node's {GPUS_PER_NODE} GPUs: "
            f"use 1, 2, 4 or 8 (GPUs per inference server; {GPUS_PER_NODE} // {TENSOR_PARALLEL_VARIABLE} "
            "servers per node)")
    servers = GPUS_PER_NODE // tensor_parallel
    first_port = _whole_number(environ, FIRST_PORT_VARIABLE, DEFAULT_FIRST_PORT, "port of each node's first server")
    if not 1 <= first_port <= 65536 - servers:
        raise SlurmDiscoveryError(
            f"{FIRST_PORT_VARIABLE}={first_port} is not a port that leaves room for {servers} servers "
            f"(1 to {65536 - servers})")
    return SlurmLayout(tuple(hosts), training, tensor_parallel, first_port)


def slurm_inference_urls(environ: Optional[Mapping[str, str]] = None) -> list[str]:
    """The URLs (``http://HOST:PORT/v1``) of the inference servers of the Slurm job
    described by `environ` (default: this process's environment), or ``[]`` when there is
    no job (``SLURM_JOB_NODELIST`` unset) or it has a single node: the caller then uses
    its configured servers. Raises `SlurmDiscoveryError` on a bad variable or when
    scontrol is missing or fails."""
    environ = os.environ if environ is None else environ
    nodelist = (environ.get(NODELIST_VARIABLE) or "").strip()
    if not nodelist:
        log.warning("Slurm discovery is on but %s is not set (not in a Slurm job): using the configured servers",
                    NODELIST_VARIABLE)
        return []
    hosts = job_hostnames(nodelist)
    if len(hosts) < 2:
        log.info("the Slurm job has %d node (%s): using the configured servers", len(hosts), nodelist)
        return []
    layout = read_layout(hosts, environ)
    urls = layout.urls()
    log.info("Slurm job %s: %d inference servers on %s (%d per node, ports %d-%d)", nodelist, len(urls),
             ", ".join(layout.inference_hosts), layout.servers_per_node, layout.first_port,
             layout.first_port + layout.servers_per_node - 1)
    return urls
