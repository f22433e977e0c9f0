"""Installing packages into a virtual environment: with uv where it is at hand, with pip otherwise.

uv installs the releases pip would install (it is told to weigh every index alike, as pip
does) in a fraction of the time: on a 2-core CPU the vLLM runtime took 63 s against pip's
214-221 s, both writing bytecode (18 s without), and CI's set-up 1.5 min against 8. uv reads
none of pip's configuration, so pip's own settings (from its files and its ``PIP_*``
variables, as ``pip config list`` shows them) are handed to uv as flags; a pip setting uv has
no counterpart for sends the install to pip instead, so that uv never installs something pip
would not.

uv is looked for in ``$ATROPOS_UV`` (a path; ``pip`` there turns uv off), beside the running
interpreter (a venv that holds the ``uv`` package), then on ``PATH``. The scripts run this
file before the project is installed, so it imports nothing but the standard library.
"""

from __future__ import annotations

import argparse
import ast
import os
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional, Sequence

# pip's settings (without their section) that become one uv flag per listed value
LISTED_FLAGS = {"index-url": "--index-url", "extra-index-url": "--extra-index-url", "find-links": "--find-links",
                "constraint": "--constraint", "trusted-host": "--allow-insecure-host"}
# pip's settings that become a variable of uv's environment
AS_ENVIRONMENT = {"cert": ("SSL_CERT_FILE",), "timeout": ("UV_HTTP_TIMEOUT",),
                  "default-timeout": ("UV_HTTP_TIMEOUT",), "proxy": ("HTTP_PROXY", "HTTPS_PROXY")}
# pip's settings that change nothing uv would install
WITHOUT_EFFECT = {"disable-pip-version-check", "no-cache-dir", "cache-dir", "quiet", "verbose", "progress-bar",
                  "root-user-action", "no-warn-script-location", "retries", "no-input", "no-color", "log",
                  "config-file", "require-virtualenv", "break-system-packages"}
COMPILE = "--compile-bytecode"
# the sections pip reads for `pip install`, in the order later ones override earlier ones
INSTALL_SECTIONS = ("global", "install", ":env:")


@dataclass
class UvCommand:
    """uv, with the flags and environment that make it install what pip, as configured here, would."""

    uv: str
    flags: list[str]
    environment: dict[str, str]


@dataclass
class InstallCommand:
    """One install (or uninstall) into a venv: the command line and what it adds to the environment."""

    argv: list[str]
    environment: dict[str, str] = field(default_factory=dict)

    def shown(self) -> str:
        """The command as a person would type it (the program by its name, not its path)."""
        return shlex.join([Path(self.argv[0]).name, *self.argv[1:]])

    def run(self) -> None:
        subprocess.run(self.argv, check=True, env={**os.environ, **self.environment})


def find_uv() -> Optional[str]:
    chosen = os.environ.get("ATROPOS_UV", "")
    if chosen == "pip":
        return None
    if chosen:
        if not (os.path.isfile(chosen) and os.access(chosen, os.X_OK)):
            raise FileNotFoundError(f"ATROPOS_UV={chosen} is not an executable: name uv's path, or `pip` for pip")
        return chosen
    beside = Path(sys.executable).with_name("uv")
    return str(beside) if beside.is_file() else shutil.which("uv")


def pip_settings(python: Path) -> dict[str, str]:
    """pip's install settings as `python -m pip config list` reports them (files, then PIP_* variables)."""
    listed = subprocess.run([str(python), "-m", "pip", "config", "list"], capture_output=True, text=True, check=True)
    settings: dict[str, dict[str, str]] = {section: {} for section in INSTALL_SECTIONS}
    for line in listed.stdout.splitlines():
        name, _, value = line.partition("=")
        section, _, key = name.rpartition(".")
        if section in settings and value:
            settings[section][key] = str(ast.literal_eval(value))
    merged: dict[str, str] = {}
    for section in INSTALL_SECTIONS:
        merged.update(settings[section])
    return merged


def is_true(value: str) -> bool:
    return value.lower() in ("1", "true", "yes", "on")


def uv_for(settings: dict[str, str], uv: str) -> Optional[UvCommand]:
    """uv with `settings` carried over, or None when one of them has no uv counterpart."""
    # pip takes the best release across all its indexes, and writes the installed modules' bytecode
    flags = ["--index-strategy", "unsafe-best-match", COMPILE]
    environment: dict[str, str] = {}
    for key, value in settings.items():
        if key in LISTED_FLAGS:
            flags += [part for item in value.split() for part in (LISTED_FLAGS[key], item)]
        elif key in AS_ENVIRONMENT:
            environment.update({variable: value for variable in AS_ENVIRONMENT[key]})
        elif key == "no-index":
            flags += ["--no-index"] if is_true(value) else []
        elif key in ("compile", "no-compile"):
            # pip gives either setting's value to its `compile` option as it is: "no-compile = false"
            # turns compiling off too (checked with pip 23 and 25)
            flags = [flag for flag in flags if flag != COMPILE] + ([COMPILE] if is_true(value) else [])
        elif key not in WITHOUT_EFFECT:
            return None
    return UvCommand(uv, flags, environment)


def chosen_uv(python: Path) -> Optional[UvCommand]:
    uv = find_uv()
    if uv is None:
        return None
    try:
        settings = pip_settings(python)
    except (OSError, subprocess.CalledProcessError, ValueError, SyntaxError):
        return None  # no pip to ask: its configuration cannot be carried over
    return uv_for(settings, uv)


def install_command(python: Path, requirements: Sequence[str], uninstall: bool = False,
                    bytecode: bool = True) -> InstallCommand:
    """The command that installs (or uninstalls) `requirements` into the venv of `python`; without
    `bytecode`, the installed modules are compiled when first imported instead of all at once."""
    uv = chosen_uv(python)
    if uv is None:
        verb = ["uninstall", "-y"] if uninstall else ["install", *([] if bytecode else ["--no-compile"])]
        return InstallCommand([str(python), "-m", "pip", *verb, "-q", "--disable-pip-version-check", *requirements])
    flags = [flag for flag in uv.flags if bytecode or flag != COMPILE]
    verb = ["uninstall"] if uninstall else ["install", *flags]
    return InstallCommand([uv.uv, "pip", *verb, "-q", "--python", str(python), *requirements], uv.environment)


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--python", type=Path, required=True, help="the interpreter of the venv to install into")
    parser.add_argument("--uninstall", action="store_true", help="uninstall the requirements instead")
    parser.add_argument("requirements", nargs="+",
                        help="what pip install would take (names, -e PATH, flags), after --")
    args = parser.parse_args(argv)
    try:
        install_command(args.python, args.requirements, args.uninstall).run()
    except subprocess.CalledProcessError as failed:
        return failed.returncode or 1
    except FileNotFoundError as missing:
        print(f"error: {missing}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
