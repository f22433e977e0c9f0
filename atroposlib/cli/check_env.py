"""``atropos-check-env ENV_FILE [flags]``: ``python ENV_FILE check [flags]`` for any environment file.

The file is loaded (its folder and the working directory on the import path, as when it is
run) and its environment class found: the one its ``X.cli()`` line runs, else the one
`BaseEnv` subclass it defines. The flags are those of check mode (`atroposlib.envs.check`);
the exit status is check mode's: 0 when every check passes, 1 otherwise, 2 when the file or
the flags cannot be used.
"""

from __future__ import annotations

import argparse
import inspect
import re
import runpy
import sys
from pathlib import Path
from typing import Any, Optional, Sequence

from atroposlib.envs.base import BaseEnv
from atroposlib.envs.cli import CHECK_GROUPS

PROG = "atropos-check-env"
CLI_CALL = re.compile(r"^\s+(\w+)\.cli\(\)", re.MULTILINE)
MODULE_NAME = "atropos_checked_env"


class UnusableFile(ValueError):
    """The file cannot be loaded, or defines no environment to check."""


def environment_class(path: Path) -> Any:
    """The environment class of the file at `path` (see the module docstring)."""
    if not path.is_file():
        raise UnusableFile(f"{path}: no such file")
    sys.path[:0] = [str(path.resolve().parent), str(Path.cwd())]
    try:
        namespace = runpy.run_path(str(path), run_name=MODULE_NAME)
    except SystemExit as exc:
        raise UnusableFile(f"{path} exited while loading (status {exc.code})") from None
    except Exception as exc:
        first = (str(exc).strip().splitlines() or [""])[0]
        raise UnusableFile(f"cannot load {path}: {type(exc).__name__}: {first}") from None
    defined = [value for value in namespace.values() if inspect.isclass(value) and issubclass(value, BaseEnv)
               and value.__module__ == MODULE_NAME and not inspect.isabstract(value)]
    called = [namespace[name] for name in CLI_CALL.findall(path.read_text(encoding="utf-8")) if name in namespace]
    if called:
        return called[-1]
    if len(defined) == 1:
        return defined[0]
    if not defined:
        raise UnusableFile(f"{path} defines no BaseEnv subclass")
    raise UnusableFile(f"{path} defines {len(defined)} environments ({', '.join(c.__name__ for c in defined)}) and "
                       f"runs none with .cli(): run `python {path} check` from a file that does")


def build_parser() -> argparse.ArgumentParser:
    """The tool's own arguments; every other flag is passed on to check mode (``ENV_FILE --help`` lists them)."""
    parser = argparse.ArgumentParser(
        prog=PROG, add_help=False,
        description="Runs the environment in ENV_FILE briefly against a built-in stand-in server (or the server "
        "--openai.base_url names) and checks its contract, one PASS/FAIL line per check. Exit status: 0 all pass, "
        "1 a check failed, 2 bad input.",
        epilog="Every other flag (--config, --env.FIELD, --openai.FIELD, ...) is the environment's, as in "
        f"`python ENV_FILE check`; `{PROG} ENV_FILE --help` lists them.")
    parser.add_argument("env_file", metavar="ENV_FILE", help="the environment file: a BaseEnv subclass run with .cli()")
    parser.add_argument("--groups", type=int, default=CHECK_GROUPS.default, help=CHECK_GROUPS.help)
    return parser


def main(argv: Optional[Sequence[str]] = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    if not args or args[0] in ("-h", "--help"):
        print(parser.format_help())
        raise SystemExit(0 if args else 2)
    known, rest = parser.parse_known_args(args)
    try:
        env_cls = environment_class(Path(known.env_file))
    except UnusableFile as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    from atroposlib.envs.runner import main as run

    check_argv = ["check", *rest, "--groups", str(known.groups)]
    sys.argv = [known.env_file, *check_argv]
    run(env_cls, check_argv)
