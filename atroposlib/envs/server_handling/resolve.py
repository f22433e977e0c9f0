"""Deciding the inference server configs of a run from defaults, YAML and flags."""

from __future__ import annotations

import logging
from typing import Any, Optional, Union

from pydantic import ValidationError

from atroposlib.envs.server_handling.configs import APIServerConfig, ServerBaseline
from atroposlib.utils.cli import ConfigError

ServerConfigs = Union[ServerBaseline, APIServerConfig, list[APIServerConfig]]


def _single_default(default: ServerConfigs) -> Optional[ServerBaseline]:
    if isinstance(default, list):
        return default[0] if len(default) == 1 else None
    return default


def resolve_openai_configs(
    default_server_configs: ServerConfigs,
    openai_config_dict: dict[str, Any],
    yaml_config: dict[str, Any],
    cli_passed_flags: dict[str, Any],
    logger: Optional[logging.Logger] = None,
) -> ServerConfigs:
    """The server configs of a run.

    `openai_config_dict` is the merged single-server mapping (defaults <- YAML <- flags),
    `yaml_config` the whole YAML document and `cli_passed_flags` the ``--openai.*`` flags
    given. Several servers (in YAML or in the defaults) cannot take ``--openai.*``
    overrides; a plain `ServerBaseline` with no YAML or flags is kept for discovery.
    """
    yaml_openai = yaml_config.get("openai")
    many_in_yaml = isinstance(yaml_openai, list) and len(yaml_openai) >= 2
    many_default = isinstance(default_server_configs, list) and len(default_server_configs) >= 2
    if (many_in_yaml or many_default) and cli_passed_flags:
        raise ConfigError(
            "CLI overrides of --openai.* are not supported when multiple servers are defined; "
            "edit the YAML 'openai:' list instead"
        )
    try:
        if many_in_yaml:
            return [APIServerConfig(**entry) for entry in yaml_openai]
        if isinstance(default_server_configs, APIServerConfig):
            return APIServerConfig(**openai_config_dict)
        if isinstance(default_server_configs, ServerBaseline) and not (yaml_openai or cli_passed_flags):
            return default_server_configs
        if many_default:
            if yaml_openai and logger is not None:  # Atropos ignores it too; say so instead of silently
                logger.warning("the YAML 'openai:' section (one server) is ignored: the environment's config_init "
                               "defines %d servers; list as many servers in the YAML (the same one repeated works)",
                               len(default_server_configs))
            return default_server_configs
        resolved = APIServerConfig(**openai_config_dict)
    except ValidationError as exc:
        raise ConfigError(f"invalid inference server settings {openai_config_dict}: {exc}") from None
    if logger is not None and isinstance(default_server_configs, ServerBaseline) and not isinstance(
        default_server_configs, APIServerConfig
    ):
        logger.info("using --openai / YAML settings instead of the default server discovery")
    return [resolved] if isinstance(default_server_configs, list) else resolved


def merged_openai_mapping(default: ServerConfigs, yaml_openai: Any, cli_openai: dict[str, Any]) -> dict[str, Any]:
    """defaults <- YAML <- CLI for the single-server case (a one-element YAML list is unwrapped)."""
    single = _single_default(default)
    base = single.model_dump() if single is not None else APIServerConfig().model_dump()
    if isinstance(yaml_openai, list) and len(yaml_openai) == 1:
        yaml_openai = yaml_openai[0]
    if isinstance(yaml_openai, dict):
        base.update(yaml_openai)
    base.update(cli_openai)
    return base
