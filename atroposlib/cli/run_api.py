"""`run-api`: start the trajectory API server.

Flags are generated from `ApiSettings`, so ``--state-dir``, ``--api-key`` and every
other setting are documented in one place (``run-api --help``).
"""

from __future__ import annotations

import argparse
import ipaddress
import logging
import os
import socket
import sys
import typing
from pathlib import Path
from typing import Any, Optional, Sequence

import uvicorn

from atroposlib.api.journal import StateDirLocked
from atroposlib.api.logs import configure_logging
from atroposlib.api.server import create_app
from atroposlib.api.settings import ApiSettings
from atroposlib.local.gc_freeze import freeze_imports

log = logging.getLogger("atroposlib.api")


# Extra spellings accepted for some flags.
FLAG_ALIASES = {"cors_origins": ["--cors-origin"]}


class DefaultOnceFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Appends ``(default: X)`` unless the help already says what the default is, or there is none."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if "(default" in text or action.default in (None, False, argparse.SUPPRESS):
            return text
        return super()._get_help_string(action) or text


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="run-api",
        description="Trajectory API: environments submit scored groups, trainers take batches.",
        formatter_class=DefaultOnceFormatter,
    )
    for name, field in ApiSettings.model_fields.items():
        flags = ["--" + name.replace("_", "-"), *FLAG_ALIASES.get(name, [])]
        help_text = field.description or ""
        annotation = field.annotation
        if annotation is bool:
            parser.add_argument(*flags, action="store_true", help=help_text)
            continue
        kwargs: dict[str, Any] = {"default": field.default, "help": help_text}
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        base = args[0] if typing.get_origin(annotation) is typing.Union else annotation
        if typing.get_origin(base) is typing.Literal:
            kwargs["choices"] = list(typing.get_args(base))
        else:
            kwargs["type"] = Path if base is Path else base
        parser.add_argument(*flags, **kwargs)
    return parser


def parse_settings(argv: Optional[Sequence[str]] = None) -> ApiSettings:
    return ApiSettings(**vars(build_parser().parse_args(argv)))


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _announce(settings: ApiSettings, summary: Optional[dict[str, Any]], state_dir: Optional[Path]) -> None:
    if state_dir is None:
        log.warning("state is kept in memory only (--ephemeral): a restart loses every queued group")
    if summary:
        registered = summary["registered"]
        lines = [
            "=" * 72,
            f"RESTORED RUN STATE from {summary['state_dir']}",
            f"  queued groups: {summary['queued_groups']}   buffered sequences: "
            f"{summary['buffered_sequences']}   step: {summary['current_step']}   envs: {summary['envs']}",
            f"  trainer config: {registered if registered else 'none registered'}",
            "  start with --fresh to discard it, or --ephemeral to keep state in memory only.",
            "=" * 72,
        ]
        for line in lines:
            log.warning(line)
    if not _is_loopback(settings.host) and not settings.resolved_api_key():
        log.warning(
            "!!! binding %s without --api-key: anyone who can reach this port can read and "
            "wipe the run. Set --api-key or ATROPOS_API_KEY.", settings.host,
        )


def _port_free(host: str, port: int) -> Optional[str]:
    """Why `host`:`port` cannot be listened on (None when it can), found before uvicorn logs
    its start-up lines and then fails."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        socket.create_server((host, port), family=family).close()
    except OSError as exc:
        return os.strerror(exc.errno) if exc.errno else str(exc)
    return None


def main(argv: Optional[Sequence[str]] = None) -> None:
    settings = parse_settings(argv)
    problem = _port_free(settings.host, settings.port)
    if problem is not None:
        sys.exit(f"run-api: cannot listen on {settings.host}:{settings.port}: {problem}. Stop what uses the port, "
                 "or pick another --port.")
    log_config = configure_logging(settings.log_level, settings.log_json)
    common = dict(
        host=settings.host, port=settings.port, log_config=log_config,
        log_level=settings.log_level, access_log=settings.log_level == "debug",
    )
    if settings.reload:
        os.environ["ATROPOS_API_SETTINGS"] = settings.model_dump_json()
        _announce(settings, None, None)
        uvicorn.run("atroposlib.api:app", reload=True, **common)
        return
    app = create_app(settings)
    if argv is None:
        freeze_imports()
    try:
        runtime = app.state.runtime()
    except StateDirLocked as exc:
        sys.exit(f"run-api: {exc}. Stop the other server, or pick another --state-dir or --port.")
    _announce(settings, runtime.restored_summary(), runtime.state_dir)
    uvicorn.run(app, **common)


if __name__ == "__main__":
    main()
