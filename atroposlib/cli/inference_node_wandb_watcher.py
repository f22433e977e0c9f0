"""`inference-node-wandb-watcher`: report an inference node's server health to W&B.

One watcher runs on each inference node. It waits until a trainer has registered a W&B
project with the trajectory API, starts a run ``inf_node_<node>`` in that project and
group, and then, every ``--interval`` seconds, asks each of the node's inference servers
for ``/health_generate``. Whenever the trainer's step (``GET /status``) has moved on, it
logs one gauge per server, ``server/server_health_<node>_<i>`` (1 healthy, 0 not), at
that step. W&B may be offline or disabled; without an API key it logs offline rather
than asking for one.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence

import httpx

from atroposlib.envs.wandb_logging import wandb_api_key_available
from atroposlib.local.help_format import DefaultsHelpFormatter
from atroposlib.local.signals import StopSignal, stop_signals_raise

PROG = "inference-node-wandb-watcher"
GPUS_PER_NODE = 8
WANDB_INFO_POLL_SECONDS = 1.0

Echo = Callable[[str], None]
LogGauges = Callable[[dict[str, float], int], None]


@dataclass(frozen=True)
class Options:
    api_addr: str
    node_num: int
    num_servers: int
    base_port: int = 9000
    host: str = "localhost"
    interval: float = 60.0
    timeout: float = 10.0

    def gauge_name(self, index: int) -> str:
        return f"server/server_health_{self.node_num}_{index}"

    def health_url(self, index: int) -> str:
        host = f"[{self.host}]" if ":" in self.host and not self.host.startswith("[") else self.host
        return f"http://{host}:{self.base_port + index}/health_generate"


def echo(line: str) -> None:
    print(f"{PROG}: {line}", flush=True)


class Streak:
    """Reports a failing call once when it starts failing and once when it works again."""

    def __init__(self, what: str, out: Echo) -> None:
        self.what = what
        self.out = out
        self.failing = False

    def failed(self, reason: str) -> None:
        if not self.failing:
            self.out(f"{self.what} failed: {reason} (retrying; reported once until it works again)")
        self.failing = True

    def succeeded(self) -> None:
        if self.failing:
            self.out(f"{self.what} works again")
        self.failing = False


def describe_error(exc: BaseException) -> str:
    if isinstance(exc, httpx.HTTPStatusError):
        hint = " (set ATROPOS_API_KEY to the API's key)" if exc.response.status_code == 401 else ""
        return f"HTTP {exc.response.status_code}{hint}"
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


class Watcher:
    """The watcher's loop, one `tick` at a time; clients, clock and sleep are injectable."""

    def __init__(
        self,
        options: Options,
        api: httpx.Client,
        probes: httpx.Client,
        *,
        out: Echo = echo,
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.options = options
        self.api = api
        self.probes = probes
        self.out = out
        self.sleep = sleep
        self.clock = clock
        self.gauges: dict[str, float] = {options.gauge_name(i): 0.0 for i in range(options.num_servers)}
        self.healthy: list[Optional[bool]] = [None] * options.num_servers
        self.last_step: Optional[int] = None
        self.log_gauges: Optional[LogGauges] = None
        self._wandb_info = Streak(f"GET {options.api_addr}/wandb_info", out)
        self._status = Streak(f"GET {options.api_addr}/status", out)
        self._logging = Streak("logging to W&B", out)

    # -- the API ------------------------------------------------------------------------
    def _get_json(self, path: str) -> Any:
        response = self.api.get(path)
        response.raise_for_status()
        return response.json()

    def fetch_wandb_info(self) -> Optional[tuple[str, Optional[str]]]:
        """(project, group) once a trainer has set a project; None before, or on an error."""
        try:
            info = self._get_json("/wandb_info")
            project, group = info.get("project"), info.get("group")
        except (httpx.HTTPError, ValueError, AttributeError) as exc:
            self._wandb_info.failed(describe_error(exc))
            return None
        self._wandb_info.succeeded()
        return (str(project), None if group is None else str(group)) if project else None

    def wait_for_wandb_info(self) -> tuple[str, Optional[str]]:
        self.out(f"node {self.options.node_num}: waiting for a trainer to set a W&B project "
                 f"(GET {self.options.api_addr}/wandb_info every {WANDB_INFO_POLL_SECONDS:g} s)")
        while True:
            info = self.fetch_wandb_info()
            if info is not None:
                return info
            self.sleep(WANDB_INFO_POLL_SECONDS)

    def read_step(self) -> Optional[int]:
        try:
            step = self._get_json("/status")["current_step"]
            if not isinstance(step, int) or isinstance(step, bool):
                raise ValueError(f"current_step is {step!r}, not an integer")
        except (httpx.HTTPError, ValueError, KeyError, TypeError) as exc:
            self._status.failed(describe_error(exc))
            return None
        self._status.succeeded()
        return step

    # -- the inference servers ----------------------------------------------------------
    def probe_one(self, index: int) -> bool:
        try:
            return self.probes.get(self.options.health_url(index)).status_code == 200
        except (httpx.HTTPError, httpx.InvalidURL, OSError):
            return False

    def probe(self) -> None:
        changes = []
        for index in range(self.options.num_servers):
            healthy = self.probe_one(index)
            self.gauges[self.options.gauge_name(index)] = 1.0 if healthy else 0.0
            if healthy != self.healthy[index]:
                url = self.options.health_url(index)
                changes.append(f"server {index} ({url}) {'up' if healthy else 'DOWN'}")
            self.healthy[index] = healthy
        if changes:
            self.out(f"health: {', '.join(changes)}")

    # -- the loop -----------------------------------------------------------------------
    def log(self, step: int) -> None:
        assert self.log_gauges is not None, "start logging before the first tick"
        try:
            self.log_gauges(dict(self.gauges), step)
        except Exception as exc:  # a W&B hiccup must not stop the watching
            self._logging.failed(describe_error(exc))
            return
        self._logging.succeeded()
        if self.last_step is None:
            up = sum(bool(value) for value in self.gauges.values())
            self.out(f"logged the first gauges at step {step} ({up}/{len(self.gauges)} servers up)")
        self.last_step = step

    def tick(self) -> None:
        """Probe every server, then log the gauges if the trainer's step has moved on
        (the first tick logs at the current step, whatever it is)."""
        self.probe()
        step = self.read_step()
        if step is not None and (self.last_step is None or step > self.last_step):
            self.log(step)

    def run(self, log_gauges: LogGauges, ticks: Optional[int] = None) -> None:
        """Tick every `interval` seconds (from the start of one tick to the next), forever
        unless `ticks` is given."""
        self.log_gauges = log_gauges
        done = 0
        while ticks is None or done < ticks:
            started = self.clock()
            self.tick()
            done += 1
            if ticks is None or done < ticks:
                self.sleep(max(0.0, self.options.interval - (self.clock() - started)))


# -- W&B ------------------------------------------------------------------------------------
def wandb_mode(out: Echo) -> Optional[str]:
    """None (W&B's own choice) when W&B is set to offline or disabled, or a key is configured;
    otherwise "offline", because W&B would ask for a key on a terminal, or fail without one."""
    mode = os.environ.get("WANDB_MODE", "").strip().lower()
    disabled = os.environ.get("WANDB_DISABLED", "").strip().lower() in ("1", "true", "yes")
    if mode in ("offline", "dryrun", "disabled") or disabled or wandb_api_key_available():
        return None
    out("no W&B API key (WANDB_API_KEY or `wandb login`): logging offline; "
        "upload later with `wandb sync`, or set WANDB_MODE=disabled")
    return "offline"


def start_wandb(project: str, group: Optional[str], name: str, out: Echo) -> Any:
    import wandb

    mode = wandb_mode(out)
    try:
        return wandb.init(project=project, group=group, name=name, mode=mode)
    except Exception as exc:  # an outage or a rejected key: keep the gauges locally instead
        if mode == "offline":
            raise
        out(f"W&B did not start ({describe_error(exc)}); logging offline instead")
        return wandb.init(project=project, group=group, name=name, mode="offline")


def finish_wandb() -> None:
    import wandb

    if wandb.run is not None:
        wandb.finish()


def api_headers() -> dict[str, str]:
    key = os.environ.get("ATROPOS_API_KEY")
    return {"Authorization": f"Bearer {key}"} if key else {}


def watch(options: Options, out: Echo = echo) -> None:
    """Wait for the trainer's W&B project, then watch until stopped; W&B is finished on the way out."""
    timeout = httpx.Timeout(options.timeout)
    with httpx.Client(base_url=options.api_addr, headers=api_headers(), timeout=timeout) as api, \
            httpx.Client(timeout=timeout) as probes:
        watcher = Watcher(options, api, probes, out=out)
        project, group = watcher.wait_for_wandb_info()
        try:
            run = start_wandb(project, group, f"inf_node_{options.node_num}", out)
            first, last = options.health_url(0), options.health_url(options.num_servers - 1)
            servers = first if options.num_servers == 1 else f"{first} .. {last}"
            mode = getattr(getattr(run, "settings", None), "mode", None)
            out(f"watching {options.num_servers} server(s) at {servers} every {options.interval:g} s; "
                f"W&B project {project!r} group {group!r} run inf_node_{options.node_num}"
                + (f" ({mode})" if mode else ""))
            watcher.run(lambda gauges, step: run.log(gauges, step=step))
        finally:
            finish_wandb()


# -- command line -------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG, formatter_class=DefaultsHelpFormatter,
        description="Log the health of an inference node's servers to the trainer's W&B project.",
    )
    parser.add_argument("--api_addr", "--api-addr", dest="api_addr", required=True, metavar="URL",
                        help="trajectory API address, e.g. http://trainer-host:8000 "
                             "(bearer token from ATROPOS_API_KEY)")
    parser.add_argument("--tp", type=int, required=True, metavar="N",
                        help=f"tensor-parallel size of each server (1-{GPUS_PER_NODE}); "
                             f"the node runs {GPUS_PER_NODE} // tp servers")
    parser.add_argument("--node_num", "--node-num", dest="node_num", type=int, required=True, metavar="N",
                        help="this node's number, in the run name inf_node_<n> and the gauge names")
    parser.add_argument("--num-servers", "--num_servers", dest="num_servers", type=int, metavar="N",
                        help=f"servers to probe (default: {GPUS_PER_NODE} // tp)")
    parser.add_argument("--base-port", "--base_port", dest="base_port", type=int, default=9000, metavar="PORT",
                        help="port of server 0; server i listens on base port + i")
    parser.add_argument("--host", default="localhost", metavar="HOST", help="host the inference servers listen on")
    parser.add_argument("--interval", type=float, default=60.0, metavar="SECONDS", help="seconds between health checks")
    parser.add_argument("--timeout", type=float, default=10.0, metavar="SECONDS", help="seconds each HTTP request may take")
    return parser


def parse_options(argv: Optional[Sequence[str]] = None) -> Options:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not 1 <= args.tp <= GPUS_PER_NODE:
        parser.error(f"--tp must be between 1 and {GPUS_PER_NODE} (GPUs per server on an "
                     f"{GPUS_PER_NODE}-GPU node), got {args.tp}")
    num_servers = GPUS_PER_NODE // args.tp if args.num_servers is None else args.num_servers
    if num_servers < 1:
        parser.error(f"--num-servers must be at least 1, got {num_servers}")
    if not 1 <= args.base_port or args.base_port + num_servers - 1 > 65535:
        parser.error(f"ports {args.base_port}..{args.base_port + num_servers - 1} are not all valid TCP ports")
    for flag, value in (("--interval", args.interval), ("--timeout", args.timeout)):
        if not value > 0:
            parser.error(f"{flag} must be a positive number of seconds, got {value}")
    api_addr = args.api_addr.strip().rstrip("/")
    if "://" not in api_addr:
        api_addr = "http://" + api_addr
    return Options(api_addr=api_addr, node_num=args.node_num, num_servers=num_servers,
                   base_port=args.base_port, host=args.host, interval=args.interval, timeout=args.timeout)


def main(argv: Optional[Sequence[str]] = None) -> None:
    options = parse_options(argv)
    try:
        with stop_signals_raise():
            watch(options)
    except StopSignal as stop:
        echo(str(stop))
        sys.exit(128 + signal.Signals[stop.signal_name].value)
    except KeyboardInterrupt:
        echo("interrupted")
        sys.exit(128 + signal.SIGINT.value)


if __name__ == "__main__":
    main()
