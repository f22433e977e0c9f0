"""The environment command line: flags, YAML, precedence and server resolution."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from atroposlib.envs.base import APIServerConfig, BaseEnv, BaseEnvConfig, ServerBaseline
from atroposlib.envs.cli import ConfigError, available_flags, parse_flags, resolve_settings
from atroposlib.envs.runner import main


class Demo(BaseEnv):
    name = "demo"

    async def get_next_item(self):
        return None


class Listed(Demo):
    @classmethod
    def config_init(cls):
        return BaseEnvConfig(group_size=8), [APIServerConfig(base_url="http://a/v1"), APIServerConfig(base_url="http://b/v1")]


FLAGS = available_flags(BaseEnvConfig)


def test_flag_forms() -> None:
    values = parse_flags(["--env.total_steps", "-1", "--env.group_size=8", "--slurm", "--testing", "false",
                          "--env.wandb_name", "None", "--openai.base_url", "http://x/v1"], FLAGS)
    assert values == {"env.total_steps": "-1", "env.group_size": "8", "slurm": "true", "testing": "false",
                      "env.wandb_name": None, "openai.base_url": "http://x/v1"}


def test_unknown_flag_suggests_the_closest() -> None:
    with pytest.raises(ConfigError, match="did you mean --env.group_size"):
        parse_flags(["--env.grup_size", "4"], FLAGS)


def test_precedence_cli_over_yaml_over_defaults(tmp_path: Path) -> None:
    config = tmp_path / "run.yaml"
    config.write_text("env:\n  group_size: 6\n  max_token_length: 100\n  unknown_key: 1\n"
                      "openai:\n  base_url: http://yaml/v1\n  weight: 2\nslurm: false\ntinker: {}\n")
    settings = resolve_settings(Demo, ["serve", "--config", str(config), "--env.group_size", "2", "--openai.model_name", "m"])
    assert (settings.env_config.group_size, settings.env_config.max_token_length) == (2, 100)
    assert settings.server_configs.base_url == "http://yaml/v1" and settings.server_configs.model_name == "m"
    assert settings.env_config.wandb_name == "demo"


def test_strict_config_turns_unknown_yaml_keys_into_errors(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    config = tmp_path / "run.yaml"
    config.write_text("env:\n  group_size: 6\n  start_tok_length: 1\nopenai:\n  base_url: http://yaml/v1\n  colour: red\n")
    settings = resolve_settings(Demo, ["serve", "--config", str(config)])
    assert settings.env_config.group_size == 6
    assert "env.start_tok_length" in caplog.text and "openai.colour" in caplog.text
    with pytest.raises(ConfigError, match="env.start_tok_length.*openai.colour.*--strict-config"):
        resolve_settings(Demo, ["serve", "--config", str(config), "--strict-config"])


def test_unreadable_yaml_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read --config"):
        resolve_settings(Demo, ["serve", "--config", str(tmp_path / "missing.yaml")])
    broken = tmp_path / "broken.yaml"
    broken.write_text("env: [unclosed\n")
    with pytest.raises(ConfigError, match="cannot read --config"):
        resolve_settings(Demo, ["serve", "--config", str(broken)])


def test_openai_flags_convert_a_baseline_in_every_mode() -> None:
    for mode in ("serve", "process", "evaluate"):
        settings = resolve_settings(Demo, [mode, "--openai.base_url", "http://h/v1"])
        assert isinstance(settings.server_configs, APIServerConfig) and settings.server_configs.base_url == "http://h/v1"
    assert type(resolve_settings(Demo, ["serve"]).server_configs) is ServerBaseline


def test_process_mode_defaults() -> None:
    env = resolve_settings(Demo, ["process"]).env_config
    assert (env.ensure_scores_are_not_same, env.include_messages, env.data_path_to_save_groups) == (False, True, "data/demo.jsonl")


class Quiet(Demo):
    @classmethod
    def config_init(cls):
        return BaseEnvConfig(use_wandb=False, ensure_scores_are_not_same=True), ServerBaseline()


def test_process_and_evaluate_turn_wandb_on_unless_config_init_turned_it_off() -> None:
    for mode in ("process", "evaluate"):
        assert resolve_settings(Demo, [mode]).env_config.use_wandb is True
        assert resolve_settings(Quiet, [mode]).env_config.use_wandb is False
    # the other process defaults are Atropos's, over config_init
    assert resolve_settings(Quiet, ["process"]).env_config.ensure_scores_are_not_same is False
    assert resolve_settings(Quiet, ["process", "--env.use_wandb", "true"]).env_config.use_wandb is True


def test_multiple_servers_refuse_openai_overrides() -> None:
    assert len(resolve_settings(Listed, ["serve"]).server_configs) == 2
    with pytest.raises(ConfigError, match="multiple servers"):
        resolve_settings(Listed, ["serve", "--openai.model_name", "x"])


def test_mode_is_required_and_values_are_validated() -> None:
    with pytest.raises(ConfigError, match="choose a mode"):
        resolve_settings(Demo, [])
    with pytest.raises(ConfigError, match="invalid environment settings"):
        resolve_settings(Demo, ["serve", "--env.group_size", "many"])


def test_help_lists_every_field_with_its_description_and_default(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as stopped:
        resolve_settings(Demo, ["process", "--help"])
    assert stopped.value.code == 0
    text = capsys.readouterr().out
    assert text.startswith("usage: ")
    for name, info in type(Demo.config_init()[0]).model_fields.items():
        assert f"--env.{name}" in text
    group_size = next(line for line in text.splitlines() if "--env.group_size " in line)
    assert "Rollouts per group" in group_size and "(default: " in group_size
    assert "--openai.base_url" in text and "--strict-config" in text and "--proxy_url" in text


class Tuned(Demo):
    @classmethod
    def config_init(cls):
        return BaseEnvConfig(group_size=16, total_steps=7), APIServerConfig(base_url="http://tuned/v1", model_name="m1")


def _help(env_cls: type, mode: str, capsys: pytest.CaptureFixture[str]) -> dict[str, str]:
    with pytest.raises(SystemExit) as stopped:
        resolve_settings(env_cls, [mode, "--help"])
    assert stopped.value.code == 0
    return {line.split()[0]: line for line in capsys.readouterr().out.splitlines() if line.startswith("  --")}


def test_help_shows_the_values_the_environment_uses(capsys: pytest.CaptureFixture[str]) -> None:
    lines = _help(Tuned, "process", capsys)
    assert lines["--env.group_size"].endswith("(default: 16)")
    assert lines["--env.total_steps"].endswith("(default: 7)")
    assert lines["--env.ensure_scores_are_not_same"].endswith("(default: False)")  # process mode's own default
    assert lines["--env.data_path_to_save_groups"].endswith("(default: data/demo.jsonl)")
    assert lines["--openai.base_url"].endswith("(default: http://tuned/v1)")
    assert lines["--openai.model_name"].endswith("(default: m1)")
    serve = _help(Tuned, "serve", capsys)
    assert serve["--env.ensure_scores_are_not_same"].endswith("(default: True)")
    assert serve["--env.data_path_to_save_groups"].endswith("(default: null)")
    several = _help(Listed, "serve", capsys)
    assert "set per server by Listed.config_init (2 servers)" in several["--openai.base_url"]


def test_a_mistyped_mode_gets_a_suggestion() -> None:
    with pytest.raises(ConfigError, match="unknown mode 'proces'; did you mean process?"):
        resolve_settings(Demo, ["proces"])
    with pytest.raises(ConfigError, match="unknown mode 'train'; choose one of serve, process, evaluate"):
        resolve_settings(Demo, ["train"])


def test_help_without_a_mode_lists_the_modes(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as stopped:
        resolve_settings(Demo, ["--help"])
    assert stopped.value.code == 0
    text = capsys.readouterr().out
    assert all(f"  {mode}" in text for mode in ("serve", "process", "evaluate"))


def test_cli_gives_the_callers_sigterm_handler_back(capsys: pytest.CaptureFixture[str]) -> None:
    def callers_handler(signum: int, frame: object) -> None:
        pass

    previous = signal.signal(signal.SIGTERM, callers_handler)
    try:
        with pytest.raises(SystemExit) as stopped:
            main(Demo, ["process", "--env.group_size", "not-a-number"])
        assert stopped.value.code == 2 and "group_size" in capsys.readouterr().err
        assert signal.getsignal(signal.SIGTERM) is callers_handler
    finally:
        signal.signal(signal.SIGTERM, previous)
