"""CONFIG.md is what scripts/gen_config_md.py makes of the code, on any machine and at any
path, and documents every flag and field; the README has its quickstart."""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import re
import sys
from pathlib import Path

import pytest

from scripts import gen_config_md
from scripts.flag_tables import DocDefaults, FlagDoc, UndocumentedDefault, format_default, markdown_text, merged_docs

ROOT = Path(__file__).resolve().parent.parent
REGENERATE = "python scripts/gen_config_md.py"


@pytest.fixture(scope="module")
def generated() -> str:
    pytest.importorskip("torch")  # the trainer's parser imports it
    return gen_config_md.render()


def test_config_md_is_up_to_date(generated: str) -> None:
    current = (ROOT / "CONFIG.md").read_text()
    assert current == generated, "CONFIG.md is out of date:\n" + gen_config_md.diff_summary(current, generated)


def _spelled(action: argparse.Action) -> str:
    if action.option_strings:
        return action.option_strings[0]
    return action.metavar if isinstance(action.metavar, str) else action.dest.upper()


def test_every_flag_of_every_command_is_documented(generated: str) -> None:
    parsers = gen_config_md.console_parsers()
    section = (ROOT / "pyproject.toml").read_text().split("[project.scripts]")[1].split("\n[")[0]
    scripts = re.findall(r"^([\w-]+) = ", section, re.MULTILINE)  # tomllib needs Python 3.11
    assert "run-api" in scripts and "atropos-grpo" in scripts
    assert set(gen_config_md.SCRIPT_BLOCKS) == set(scripts), "a console tool without a CONFIG.md table"
    for script, blocks in gen_config_md.SCRIPT_BLOCKS.items():
        assert any(name == script or name.startswith(script + " ") for name in parsers), script
        assert set(blocks) <= set(gen_config_md.BLOCKS) and f"`{script}" in generated, script
    for tool, parser in parsers.items():
        for action in parser._actions:
            if isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)):
                continue
            assert f"`{_spelled(action)}`" in generated, (tool, _spelled(action))


def test_every_model_field_is_documented(generated: str) -> None:
    from atroposlib.api.settings import ApiSettings
    from atroposlib.envs.config import BaseEnvConfig
    from atroposlib.envs.server_handling.configs import APIServerConfig, ServerBaseline, ServerManagerConfig
    from example_trainer.config import TrainingConfig

    spellings = {
        ApiSettings: lambda name: [f"`--{name.replace('_', '-')}`"],
        BaseEnvConfig: lambda name: [f"`--env.{name}`"],
        APIServerConfig: lambda name: [f"`--openai.{name}`"],
        ServerBaseline: lambda name: [f"`--openai.{name}`", f"`{name}`"],
        ServerManagerConfig: lambda name: [f"`--{name}`"],
        TrainingConfig: lambda name: [f"`--{name.replace('_', '-')}`", f"`{name}`"],
    }
    for model, spelled in spellings.items():
        for name in model.model_fields:
            assert any(spelling in generated for spelling in spelled(name)), (model.__name__, name)


def test_trainer_flags_default_to_the_training_config_defaults() -> None:
    pytest.importorskip("torch")
    from example_trainer.cli import _DEST_TO_FIELD, create_full_parser
    from example_trainer.config import TrainingConfig

    for action in create_full_parser()._actions:
        field = TrainingConfig.model_fields.get(_DEST_TO_FIELD.get(action.dest, action.dest))
        if field is not None and not action.required:
            assert action.default == field.get_default(call_default_factory=True), action.dest


def test_the_document_is_the_same_in_a_clone_elsewhere_with_other_settings(tmp_path: Path) -> None:
    """What CI sees: a clone at a path with hyphens, another home, keys and folders set."""
    pytest.importorskip("torch")
    clone = tmp_path / "ci-final" / "atropos-clone"
    for folder in ("atroposlib", "example_trainer", "scripts", "docs"):
        shutil.copytree(ROOT / folder, clone / folder, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "CONFIG.md", clone / "CONFIG.md")
    shutil.copy(ROOT / "pyproject.toml", clone / "pyproject.toml")
    elsewhere = {"ATROPOS_API_KEY": "secret-key", "ATROPOS_PROXY_API_KEY": "proxy-key",
                 "ATROPOS_API_STATE_DIR": str(tmp_path / "state-dir"), "ATROPOS_HOME": str(tmp_path / "atropos-home"),
                 "ATROPOS_VLLM_RUNTIME": str(tmp_path / "runtime"), "ATROPOS_PROXY_URL": "http://proxy-host:9100",
                 "HOME": str(tmp_path / "other-home"), "USER": "someone-else"}
    result = subprocess.run([sys.executable, str(clone / "scripts" / "gen_config_md.py"), "--check"],
                            cwd=tmp_path, env={**os.environ, **elsewhere}, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    text = (ROOT / "CONFIG.md").read_text()
    for leak in (str(ROOT), str(Path.home()), *elsewhere.values()):
        assert leak not in text, leak


def test_check_reports_a_stale_file_with_the_command_to_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                            capsys: pytest.CaptureFixture[str], generated: str) -> None:
    stale = tmp_path / "CONFIG.md"
    stale.write_text(generated.replace("| `--port` | `8000` |", "| `--port` | `8001` |"))
    monkeypatch.setattr(gen_config_md, "OUTPUT", stale)
    monkeypatch.setattr(gen_config_md, "render", lambda: generated)
    assert gen_config_md.main(["--check"]) == 1
    report = capsys.readouterr().err
    assert "-| `--port` | `8001` |" in report and "+| `--port` | `8000` |" in report
    assert f"2 line(s) differ: run `{REGENERATE}`" in report
    assert gen_config_md.main([]) == 0 and stale.read_text() == generated
    assert gen_config_md.main(["--check"]) == 0


def test_tools_sharing_flags_get_one_row_per_flag_naming_each_tools_value() -> None:
    sft = [FlagDoc(("--margin",), "`0.0`", "Score margin."), FlagDoc(("--top-n",), "`3`", "Rows kept.")]
    dpo = [FlagDoc(("--margin",), "`0.5`", "Score margin."), FlagDoc(("--seed",), "–", "Seed of the draw.")]
    rows = merged_docs({"sft": sft, "dpo": dpo})
    assert [(row.name, row.default, row.meaning) for row in rows] == [
        ("--margin", "sft `0.0`, dpo `0.5`", "Score margin."),
        ("--top-n", "`3`", "sft only: rows kept."),
        ("--seed", "–", "dpo only: seed of the draw."),
    ]


def test_machine_paths_need_a_documented_default_and_help_text_becomes_markdown() -> None:
    with pytest.raises(UndocumentedDefault, match="DOC_DEFAULTS"):
        format_default("tool", "--env-file", Path("/somewhere/env.py"), "–")
    assert format_default("run-api", "--max-body-bytes", 256 * 1024 * 1024, "–") == "`268435456` (256 MiB)"
    assert format_default("tool", "--key", "", "–") == '`""`'
    text = markdown_text("'warn' with --api-key or $ATROPOS_API_KEY; a|b <name> <= 0; see CONFIG.md#levels",
                         ["levels"])
    assert text == "`warn` with `--api-key` or `$ATROPOS_API_KEY`; a\\|b &lt;name> <= 0; see [Levels](#levels)"
    with pytest.raises(ValueError, match="no heading"):
        markdown_text("see CONFIG.md#gone", ["levels"])
    defaults = DocDefaults({("tool", "--used"): "x", ("tool", "--stale"): "y"})
    assert defaults.get("tool", "--used") == "x" and defaults.unused() == [("tool", "--stale")]


def test_readme_has_the_two_quickstart_commands() -> None:
    text = (ROOT / "README.md").read_text()
    assert "## Quickstart" in text
    assert "bash scripts/test.sh" in text


def test_every_install_hint_names_extras_as_every_pip_finds_them() -> None:
    # pip before 23.3 compares the requested extra with the wheel's normalised name as written:
    # asking for the underscore spelling of example-trainer then installs nothing extra, with a warning.
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = set(project["optional-dependencies"])
    normalised = {re.sub(r"[-_.]+", "-", name).lower() for name in extras}
    folders = ("atroposlib", "example_trainer", "environments", "scripts", "bench", "docs", "tests")
    files = [ROOT / "pyproject.toml", *ROOT.glob("*.md"),
             *(path for folder in folders for path in (ROOT / folder).rglob("*") if path.suffix in (".py", ".md", ".sh"))]
    for path in files:
        for requested in re.findall(r"atroposlib\[([A-Za-z0-9_.,\- ]+)\]", path.read_text(errors="replace")):
            for name in (part.strip() for part in requested.split(",")):
                assert name in normalised, f"{path.relative_to(ROOT)}: atroposlib[{requested}] asks for {name!r}; " \
                                           f"write it as pip normalises it ({sorted(normalised)})"
