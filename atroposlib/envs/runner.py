"""Running an environment class from the command line (what ``MyEnv.cli()`` does); check mode
is `atroposlib.envs.check`, rescore mode `atroposlib.envs.rescore`."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
import threading
from pathlib import Path
from typing import Any, Optional, Sequence

import yaml

from atroposlib.envs.cli import ConfigError, RunSettings, describe, resolve_settings
from atroposlib.envs.serve_mode import ServeSetupError
from atroposlib.envs.server_handling.api_server import ModelNotServed
from atroposlib.envs.server_handling.server_manager import ManagedServerUnsupported
from atroposlib.envs.server_handling.slurm import SlurmDiscoveryError
from atroposlib.envs.tokenizer_loading import TokenizerUnavailable
from atroposlib.local.gc_freeze import freeze_imports

log = logging.getLogger("atroposlib.envs")

LOG_LEVEL_VARIABLE = "ATROPOS_LOG_LEVEL"
# HTTP clients log one INFO line per request, which drowns the progress lines: shown at DEBUG only.
CHATTY_LOGGERS = ("httpx", "httpx2", "httpcore", "httpcore2")


def build_env(env_cls: Any, settings: RunSettings, tokenizer_on_demand: bool = False) -> Any:
    """The environment of `settings`; with `tokenizer_on_demand`, a tokenizer not on this
    machine is loaded (downloaded) only if something uses it (rescore mode may not)."""
    env_cls._manager_settings = settings.manager
    if settings.teacher_configs is not None:  # picked up by TeacherDistillationEnv.__init__
        env_cls._teacher_server_configs = settings.teacher_configs
    if tokenizer_on_demand:
        env_cls._tokenizer_on_demand = True
    try:
        return env_cls(
            config=settings.env_config, server_configs=settings.server_configs,
            slurm=settings.manager.slurm, testing=settings.manager.testing,
        )
    finally:
        if tokenizer_on_demand:
            del env_cls._tokenizer_on_demand


async def evaluate_only(env: Any, settings: RunSettings) -> None:
    if env.config.data_dir_to_save_evals:
        folder = Path(env.config.data_dir_to_save_evals)
        folder.mkdir(parents=True, exist_ok=True)
        servers = settings.server_configs
        openai = [s.model_dump() for s in servers] if isinstance(servers, list) else (
            {} if type(servers).__name__ == "ServerBaseline" else servers.model_dump())
        (folder / "evaluate_config.yaml").write_text(yaml.safe_dump({
            "env": env.config.model_dump(mode="json"), "openai": openai,
            "slurm": settings.manager.slurm, "testing": settings.manager.testing,
        }, sort_keys=False, default_flow_style=False))
    try:
        await env.setup()
        await env.run_evaluation()
    finally:
        env.close_jsonl_writer()
        await env.server.close()


def _warn_about_local_servers(settings: RunSettings) -> None:
    servers = settings.server_configs if isinstance(settings.server_configs, list) else [settings.server_configs]
    for server in servers:
        url = getattr(server, "base_url", "") or ""
        if any(host in url for host in ("localhost", "0.0.0.0", "127.0.0.1")):
            log.info("inference server %s is on this machine", url)


def configure_logging() -> None:
    """INFO (or $ATROPOS_LOG_LEVEL); per-request lines of HTTP clients only at DEBUG."""
    requested = os.environ.get(LOG_LEVEL_VARIABLE, "INFO").upper()
    level = logging.getLevelName(requested) if isinstance(logging.getLevelName(requested), int) else logging.INFO
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for name in CHATTY_LOGGERS:
        logging.getLogger(name).setLevel(logging.DEBUG if level <= logging.DEBUG else logging.WARNING)


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


def _run_mode(env: Any, settings: RunSettings) -> None:
    if settings.mode == "serve":  # serve mode handles SIGINT and SIGTERM itself, in every phase
        asyncio.run(env.env_manager())
    elif settings.mode == "process":
        asyncio.run(env.process_manager())
    else:
        asyncio.run(evaluate_only(env, settings))


def _build_and_run(env_cls: Any, argv: Sequence[str], prog: str) -> None:
    try:
        settings = resolve_settings(env_cls, list(argv))
    except (ConfigError, FileNotFoundError, yaml.YAMLError) as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    if settings.mode == "check":
        _check(env_cls, settings, prog)
    if settings.mode == "rescore":
        from atroposlib.envs.rescore import rescore

        raise SystemExit(rescore(env_cls, settings, prog))
    print(describe(settings))
    if settings.mode != "serve":
        _warn_about_local_servers(settings)
    try:
        env = build_env(env_cls, settings)
    except SlurmDiscoveryError as exc:
        print(f"{prog}: --slurm: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    if settings.mode != "serve":
        missing = asyncio.run(env.server.unreachable())
        if len(missing) == len(env.server.servers):
            env.close_jsonl_writer()  # nothing was written: no empty groups file is left
            print(f"{prog}: no inference server answers at {', '.join(missing)}; "
                  "start one or pass --openai.base_url", file=sys.stderr)
            raise SystemExit(1)
    _run_mode(env, settings)


def _check(env_cls: Any, settings: RunSettings, prog: str) -> None:
    from atroposlib.envs.check import check

    try:
        status = check(env_cls, settings)
    except SlurmDiscoveryError as exc:
        print(f"{prog}: --slurm: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    raise SystemExit(status)


def main(env_cls: Any, argv: Optional[Sequence[str]] = None) -> None:
    """Parse argv, build the environment and run the chosen mode; exit 2 on bad flags or
    Slurm variables, 1 when the tokenizer or the inference server is missing, 130 when interrupted."""
    configure_logging()
    if argv is None:
        freeze_imports()
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        pass
    else:
        raise RuntimeError("cli() must be called outside a running event loop (it calls asyncio.run)")
    prog = Path(sys.argv[0]).name
    previous = signal.getsignal(signal.SIGTERM)
    handles_sigterm = threading.current_thread() is threading.main_thread() and previous is not signal.SIG_IGN
    if handles_sigterm:
        # SIGTERM stops like Ctrl-C: tasks are cancelled and files closed (serve mode
        # installs its own handlers while it runs).
        signal.signal(signal.SIGTERM, _interrupt)
    try:
        _build_and_run(env_cls, sys.argv[1:] if argv is None else argv, prog)
    except (ServeSetupError, TokenizerUnavailable) as exc:  # the tokenizer loads at first use
        print(f"{prog}: {exc}", file=sys.stderr)
        raise SystemExit(1) from None
    except (ManagedServerUnsupported, ModelNotServed) as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        raise SystemExit(130) from None
    finally:  # a program that called cli() and goes on gets its own SIGTERM handling back
        if handles_sigterm:
            signal.signal(signal.SIGTERM, previous if previous is not None else signal.SIG_DFL)
