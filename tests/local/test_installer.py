"""atroposlib.local.installer: uv installs what pip, as configured, would; pip where uv cannot follow."""

from __future__ import annotations

import os
import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import pytest

from atroposlib.local import installer
from atroposlib.local.installer import InstallCommand, install_command, pip_settings, uv_for

ROOT = Path(__file__).resolve().parents[2]


def simple_index(folder: Path, version: str) -> str:
    """A package index on disk (PEP 503, as `file://` URLs serve it) holding `tiny_demo` at `version` alone."""
    wheel = folder / "files" / f"tiny_demo-{version}-py3-none-any.whl"
    wheel.parent.mkdir(parents=True)
    info = f"tiny_demo-{version}.dist-info"
    files = {"tiny_demo.py": f"VERSION = {version!r}\n",
             f"{info}/METADATA": f"Metadata-Version: 2.1\nName: tiny-demo\nVersion: {version}\n",
             f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: hand\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    files[f"{info}/RECORD"] = "".join(f"{name},,\n" for name in [*files, f"{info}/RECORD"])
    with zipfile.ZipFile(wheel, "w") as archive:
        for name, text in files.items():
            archive.writestr(name, text)
    page = folder / "simple" / "tiny-demo" / "index.html"
    page.parent.mkdir(parents=True)
    page.write_text(f'<html><body><a href="../../files/{wheel.name}">{wheel.name}</a></body></html>')
    return (folder / "simple").as_uri()


def a_program(path: Path) -> Path:
    """An executable file (what $ATROPOS_UV must name; these tests never run it)."""
    path.write_text("#!/bin/sh\nexit 1\n")
    path.chmod(0o755)
    return path


def pip_configured(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, text: str) -> None:
    """pip configured by `text` (with the machine's PIP_* variables, which would override it, removed)."""
    for variable in [name for name in os.environ if name.startswith("PIP_")]:
        monkeypatch.delenv(variable)
    config = tmp_path / "pip.conf"
    config.write_text(text)
    monkeypatch.setenv("PIP_CONFIG_FILE", str(config))


def test_pip_settings_merge_files_then_sections_then_variables(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pip_configured(tmp_path, monkeypatch, "[global]\nfind-links = /from/global\nextra-index-url =\n  file:///a\n"
                   "  file:///b\n[install]\nfind-links = /from/install\n[download]\nno-index = true\n")
    monkeypatch.setenv("PIP_DEFAULT_TIMEOUT", "77")
    settings = pip_settings(Path(sys.executable))
    assert settings["find-links"] == "/from/install"  # pip install reads [install] over [global]
    assert settings["extra-index-url"].split() == ["file:///a", "file:///b"]
    assert settings["default-timeout"] == "77"
    assert settings.get("no-index") is None  # [download] is another command's section


def test_pip_settings_become_uv_flags_and_environment() -> None:
    uv = uv_for({"index-url": "https://mirror/simple", "extra-index-url": "file:///a file:///b",
                 "find-links": "/wheels", "constraint": "/c.txt", "cert": "/ca.pem", "default-timeout": "180",
                 "disable-pip-version-check": "1", "no-index": "false"}, "uv")
    assert uv is not None
    assert uv.flags == ["--index-strategy", "unsafe-best-match", "--compile-bytecode", "--index-url", "https://mirror/simple",
                        "--extra-index-url", "file:///a", "--extra-index-url", "file:///b",
                        "--find-links", "/wheels", "--constraint", "/c.txt"]
    assert uv.environment == {"SSL_CERT_FILE": "/ca.pem", "UV_HTTP_TIMEOUT": "180"}


def test_bytecode_is_written_at_install_as_pip_does_unless_pip_or_the_caller_says_not_to(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ATROPOS_UV", str(a_program(tmp_path / "uv")))
    settings = {"no-index": "1"}
    monkeypatch.setattr(installer, "pip_settings", lambda python: settings)
    python = tmp_path / "bin" / "python"
    assert "--compile-bytecode" in install_command(python, ["x"]).argv
    assert "--compile-bytecode" not in install_command(python, ["x"], bytecode=False).argv
    settings["compile"] = "0"  # PIP_COMPILE=0, as scripts/test.sh sets for its set-up
    assert "--compile-bytecode" not in install_command(python, ["x"]).argv
    settings["no-compile"] = "1"  # pip reads this as compile = 1: uv follows pip, not the setting's name
    assert "--compile-bytecode" in install_command(python, ["x"]).argv
    monkeypatch.setenv("ATROPOS_UV", "pip")
    assert "--no-compile" in install_command(python, ["x"], bytecode=False).argv
    assert "--no-compile" not in install_command(python, ["x"]).argv


@pytest.mark.parametrize("setting", [{"user": "true"}, {"prefer-binary": "1"}, {"use-feature": "truststore"}])
def test_a_pip_setting_uv_cannot_follow_sends_the_install_to_pip(setting: dict[str, str], tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    assert uv_for(setting, "uv") is None
    monkeypatch.setenv("ATROPOS_UV", str(a_program(tmp_path / "uv")))
    monkeypatch.setattr(installer, "pip_settings", lambda python: setting)
    command = install_command(tmp_path / "bin" / "python", ["tiny-demo"])
    assert command.argv[1:4] == ["-m", "pip", "install"]


def test_atropos_uv_pip_turns_uv_off(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ATROPOS_UV", "pip")
    assert install_command(tmp_path / "python", ["x"], uninstall=True).argv[1:5] == ["-m", "pip", "uninstall", "-y"]


def test_an_atropos_uv_that_is_no_program_is_named_in_one_line(tmp_path: Path) -> None:
    environment = {**os.environ, "ATROPOS_UV": str(tmp_path / "no-uv")}
    done = subprocess.run([sys.executable, str(ROOT / "atroposlib" / "local" / "installer.py"), "--python",
                           sys.executable, "--", "tiny-demo"], capture_output=True, text=True, env=environment)
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    assert f"error: ATROPOS_UV={tmp_path / 'no-uv'} is not an executable" in done.stderr


def installed_version(python: Path) -> str:
    probe = subprocess.run([str(python), "-c", "import tiny_demo; print(tiny_demo.VERSION)"], capture_output=True,
                           text=True, check=True)
    return probe.stdout.strip()


@pytest.mark.parametrize("tool", ["uv", "pip"])
def test_uv_and_pip_install_from_where_pip_is_configured_to_look(tool: str, tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """Only pip's configuration names the two indexes: uv finds them and takes the release pip takes, the
    newest of both (uv alone would take the extra index's, found first)."""
    if tool == "uv" and installer.find_uv() is None:
        pytest.skip("uv is not installed (scripts/uv.sh puts it in .venv)")
    newer, older = simple_index(tmp_path / "main", "2.0"), simple_index(tmp_path / "extra", "1.0")
    pip_configured(tmp_path, monkeypatch, f"[global]\nindex-url = {newer}\nextra-index-url = {older}\n")
    if tool == "pip":
        monkeypatch.setenv("ATROPOS_UV", "pip")
    target = tmp_path / "venv"
    venv.create(target, with_pip=True)
    python = target / "bin" / "python"
    command = install_command(python, ["tiny-demo"])
    assert Path(command.argv[0]).name == ("uv" if tool == "uv" else "python")
    command.run()
    assert installed_version(python) == "2.0"
    install_command(python, ["tiny-demo"], uninstall=True).run()
    assert subprocess.run([str(python), "-c", "import tiny_demo"], capture_output=True).returncode != 0


def test_the_scripts_run_the_installer_before_the_project_is_installed(tmp_path: Path) -> None:
    """scripts/uv.sh runs installer.py as a file with the system's python: standard library only."""
    isolated = subprocess.run([sys.executable, "-I", str(ROOT / "atroposlib" / "local" / "installer.py"), "--help"],
                              capture_output=True, text=True, cwd=tmp_path)
    assert isolated.returncode == 0, isolated.stderr
    assert "--python" in isolated.stdout


def test_a_command_shows_the_program_by_its_name() -> None:
    shown = InstallCommand(["/long/path/bin/uv", "pip", "install", "-e", ".[dev, x]"]).shown()
    assert shown == "uv pip install -e '.[dev, x]'"
