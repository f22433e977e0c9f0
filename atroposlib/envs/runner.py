"""Running an environment class from the command line (what ``MyEnv.cli()`` does)."""

from __future__ import annotations

import asyncio
import logging
import sys
from pathlib import Path
from typing import Any, Optional, Sequence

import yaml

from atroposlib.envs.cli import ConfigError, RunSettings, describe, resolve_settings

log = logging.getLogger("atroposlib.envs")


def build_env(env_cls: Any, settings: RunSettings) -> Any:
    env_cls._manager_settings = settings.manager
    if settings.teacher_configs is not None:  # picked up by TeacherDistillationEnv.__init__
        env_cls._teacher_server_configs = settings.teacher_configs
    return env_cls(
        config=settings.env_config, server_configs=settings.server_configs,
        slurm=settings.manager.slurm, testing=settings.manager.testing,
    )


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
        await env.evaluate()
    finally:
        env.close_jsonl_writer()
        await env.server.close()


def _warn_about_local_servers(settings: RunSettings) -> None:
    servers = settings.server_configs if isinstance(settings.server_configs, list) else [settings.server_configs]
    for server in servers:
        url = getattr(server, "base_url", "") or ""
        if any(host in url for host in ("localhost", "0.0.0.0", "127.0.0.1")):
            log.info("inference server %s is on this machine", url)


def main(env_cls: Any, argv: Optional[Sequence[str]] = None) -> None:
    """Parse argv, build the environment and run the chosen mode; exit 2 on bad flags."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per request drowns the progress bar
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        pass
    else:
        raise RuntimeError("cli() must be called outside a running event loop (it calls asyncio.run)")
    try:
        settings = resolve_settings(env_cls, list(sys.argv[1:] if argv is None else argv))
    except (ConfigError, FileNotFoundError, yaml.YAMLError) as exc:
        print(f"{Path(sys.argv[0]).name}: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    print(describe(settings))
    if settings.mode != "serve":
        _warn_about_local_servers(settings)
    env = build_env(env_cls, settings)
    if settings.mode != "serve":
        missing = asyncio.run(env.server.unreachable())
        if len(missing) == len(env.server.servers):
            print(f"{Path(sys.argv[0]).name}: no inference server answers at {', '.join(missing)}; "
                  "start one or pass --openai.base_url", file=sys.stderr)
            raise SystemExit(1)
    if settings.mode == "serve":
        asyncio.run(env.env_manager())
    elif settings.mode == "process":
        asyncio.run(env.process_manager())
    else:
        asyncio.run(evaluate_only(env, settings))
