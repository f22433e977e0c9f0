"""The environment command line: ``python my_env.py {serve,process,evaluate,check,rescore} [flags]``.

Flags: ``--env.<field>`` for every field of the env's config class, ``--openai.<field>``
for every field of `APIServerConfig`, ``--slurm``, ``--testing``, ``--max_n_completions``,
``--proxy_url``, ``--config FILE.yaml`` and ``--strict-config`` (unknown YAML keys are
errors instead of warnings); in ``check`` mode also ``--groups N``; in ``rescore`` mode
``--input``, ``--output`` and ``--html``. Precedence: flags > YAML > ``config_init()``.
Values: ``--k v`` or ``--k=v`` (negative numbers included), a bare boolean flag means
true, ``None`` means null. argv is parsed once; unknown flags are errors with a
suggestion.
"""

from __future__ import annotations

import difflib
import logging
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Sequence

import yaml
from pydantic import BaseModel, ValidationError

from atroposlib.envs.config import BaseEnvConfig
from atroposlib.envs.constants import ENV_NAMESPACE, NAMESPACE_SEP, OPENAI_NAMESPACE
from atroposlib.envs.server_handling.configs import APIServerConfig, ServerBaseline, ServerManagerConfig
from atroposlib.envs.server_handling.resolve import (
    ConfigError,
    ServerConfigs,
    merged_openai_mapping,
    resolve_openai_configs,
)
from atroposlib.utils.cli import TRUE_WORDS, Flag, parse_flags

log = logging.getLogger("atroposlib.envs")

MODES = ("serve", "process", "evaluate", "check", "rescore")
MANAGER_FLAGS = ("slurm", "testing", "max_n_completions", "proxy_url")
MODE_DEFAULTS: dict[str, dict[str, Any]] = {
    "process": {"ensure_scores_are_not_same": False, "include_messages": True, "use_wandb": True},
    "evaluate": {"use_wandb": True},
    "check": {"use_wandb": False, "data_path_to_save_groups": None},
    "rescore": {"use_wandb": False, "data_path_to_save_groups": None},
}
CHECK_GROUPS = Flag("groups", int, 4, "check: groups to collect and check.")
RESCORE_FLAGS = (  # defaults as shown by --help: the mode derives them (atroposlib.envs.rescore)
    Flag("input", str, "required", "rescore: JSONL of saved groups (process's file, or serve's "
         "data_path_to_save_groups)."),
    Flag("output", str, "<input>_rescored.jsonl", "rescore: JSONL to write, the groups with their new scores."),
    Flag("html", str, "<output>.html", "rescore: page of the changed rollouts, old and new score side by side."),
)
# Mode defaults that give way to a value config_init sets explicitly.
CONFIG_INIT_WINS = frozenset({"use_wandb"})


@dataclass
class RunSettings:
    """Everything a mode needs to build and run the environment."""

    mode: str
    env_config: BaseEnvConfig
    server_configs: ServerConfigs
    manager: ServerManagerConfig
    yaml_path: Optional[Path] = None
    openai_flags: dict[str, Any] = field(default_factory=dict)
    teacher_configs: Optional[ServerConfigs] = None
    server_named: bool = False  # a base URL came from a flag or the YAML (check mode: no stand-in)
    check_groups: int = CHECK_GROUPS.default
    rescore_files: dict[str, Optional[str]] = field(default_factory=dict)  # rescore: input, output, html


def _model_flags(prefix: str, model: type[BaseModel]) -> dict[str, Flag]:
    return {
        f"{prefix}{NAMESPACE_SEP}{name}": Flag(f"{prefix}{NAMESPACE_SEP}{name}", f.annotation, f.default, f.description or "")
        for name, f in model.model_fields.items()
    }


def available_flags(env_config_cls: type[BaseModel], teacher_namespace: Optional[str] = None) -> dict[str, Flag]:
    flags = {**_model_flags(ENV_NAMESPACE, env_config_cls), **_model_flags(OPENAI_NAMESPACE, APIServerConfig)}
    if teacher_namespace:
        flags.update(_model_flags(teacher_namespace, APIServerConfig))
    for name in MANAGER_FLAGS:
        info = ServerManagerConfig.model_fields[name]
        flags[name] = Flag(name, info.annotation, info.default, info.description or "")
    flags["config"] = Flag("config", str, None, "YAML file with env:, openai:, slurm: and testing: sections.")
    flags["strict-config"] = Flag("strict-config", bool, False, "Unknown keys in the YAML env:/openai: sections are errors.")
    return flags


def _namespace(values: dict[str, Any], prefix: str) -> dict[str, Any]:
    start = prefix + NAMESPACE_SEP
    return {key[len(start):]: value for key, value in values.items() if key.startswith(start)}


def _load_yaml(path: Optional[str], env_config_cls: type[BaseModel], strict: bool = False) -> dict[str, Any]:
    if path is None:
        return {}
    try:
        document = yaml.safe_load(Path(path).read_text()) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(f"cannot read --config {path}: {exc}") from None
    if not isinstance(document, dict):
        raise ConfigError(f"{path} must hold a mapping with env:, openai:, slurm:, testing: sections")
    known_sections = {ENV_NAMESPACE, OPENAI_NAMESPACE, "teacher", *MANAGER_FLAGS}
    for section in set(document) - known_sections:
        log.info("ignoring YAML section %r (not used by environments)", section)
    unknown = [f"env.{key} is not a field of {env_config_cls.__name__}"
               for key in sorted(set(document.get(ENV_NAMESPACE) or {}) - set(env_config_cls.model_fields))]
    openai_entries = document.get(OPENAI_NAMESPACE) or []
    for entry in openai_entries if isinstance(openai_entries, list) else [openai_entries]:
        unknown += [f"openai.{key} is not a server setting"
                    for key in sorted(set(entry or {}) - set(APIServerConfig.model_fields))]
    if unknown and strict:
        raise ConfigError(f"{path}: " + "; ".join(unknown) + " (--strict-config)")
    for problem in unknown:
        log.warning("YAML %s; ignored", problem)
    return document


def _shown(value: Any) -> Any:
    return "null" if value is None else getattr(value, "value", value)


def help_text(prog: str, mode: str, flags: dict[str, Flag], defaults: Optional[dict[str, Any]] = None) -> str:
    """Every flag with its description and the default this environment uses in `mode`
    (`defaults`, by flag name; the field's own default otherwise)."""
    defaults = defaults or {}
    lines = [f"usage: {prog} {mode} [--config FILE.yaml] [--env.FIELD V] [--openai.FIELD V] ...", ""]
    for flag in flags.values():
        default = defaults.get(flag.name, flag.default)
        lines.append(f"  --{flag.name:<42} {flag.help} (default: {_shown(default)})")
    lines += ["", "Logging: INFO; set ATROPOS_LOG_LEVEL=DEBUG for every HTTP request."]
    return "\n".join(lines)


def modes_text(prog: str) -> str:
    return (f"usage: {prog} {{{','.join(MODES)}}} [flags]\n\n"
            "  serve      send scored groups to the trajectory API (run-api) for a trainer\n"
            "  process    write scored groups to JSONL and HTML, no API or trainer needed\n"
            "  evaluate   run the environment's evaluate()\n"
            "  check      run setup, a few groups and evaluate against a stand-in server and check the\n"
            "             contract (group size, masks, logprobs, scores, messages, config); exit 0 if all pass\n"
            "  rescore    score saved groups (--input FILE.jsonl) again with the scoring as it is now, no\n"
            "             inference; writes --output and a page of the changed rollouts, reports what changed\n\n"
            f"`{prog} MODE --help` lists every flag with the value this environment uses.")


def _choose_mode(argv: Sequence[str]) -> str:
    if argv and argv[0] in MODES:
        return argv[0]
    prog = Path(sys.argv[0]).name
    if argv and argv[0] in ("-h", "--help"):
        print(modes_text(prog))
        raise SystemExit(0)
    if argv and not argv[0].startswith("-"):
        close = difflib.get_close_matches(argv[0], MODES, n=1, cutoff=0.5)
        hint = f"; did you mean {close[0]}?" if close else f"; choose one of {', '.join(MODES)}"
        raise ConfigError(f"unknown mode {argv[0]!r}{hint}")
    raise ConfigError(f"choose a mode: {' | '.join(MODES)} (e.g. `{prog} serve --help`)")


def _fill_derived(env_cls: Any, mode: str, values: dict[str, Any]) -> dict[str, Any]:
    """Settings left empty that follow from the env's name (in place)."""
    if mode == "process" and not values.get("data_path_to_save_groups"):
        values["data_path_to_save_groups"] = f"data/{getattr(env_cls, 'name', None) or 'groups'}.jsonl"
    if not values.get("wandb_name"):
        values["wandb_name"] = getattr(env_cls, "name", None) or env_cls.__name__.lower()
    return values


def _with_mode_defaults(mode: str, default_env: BaseEnvConfig) -> dict[str, Any]:
    """config_init's settings with the mode's defaults on top (Atropos's), except where
    config_init chose a setting the mode must not override: W&B stays off in process and
    evaluate for an environment whose config_init turns it off."""
    kept = default_env.model_fields_set & CONFIG_INIT_WINS
    mode_values = {name: value for name, value in MODE_DEFAULTS.get(mode, {}).items() if name not in kept}
    return {**default_env.model_dump(), **mode_values}


def env_defaults(env_cls: Any, mode: str, default_env: BaseEnvConfig) -> dict[str, Any]:
    """The env settings of `mode` before YAML and flags: config_init's, then the mode's."""
    return _fill_derived(env_cls, mode, _with_mode_defaults(mode, default_env))


def _help_defaults(env_cls: Any, mode: str, default_env: BaseEnvConfig, default_servers: ServerConfigs) -> dict[str, Any]:
    shown = {f"{ENV_NAMESPACE}{NAMESPACE_SEP}{k}": v for k, v in env_defaults(env_cls, mode, default_env).items()}
    if isinstance(default_servers, list) and len(default_servers) > 1:
        per_server = f"set per server by {env_cls.__name__}.config_init ({len(default_servers)} servers)"
        shown.update({f"{OPENAI_NAMESPACE}{NAMESPACE_SEP}{k}": per_server for k in APIServerConfig.model_fields})
    else:
        shown.update({f"{OPENAI_NAMESPACE}{NAMESPACE_SEP}{k}": v
                      for k, v in merged_openai_mapping(default_servers, None, {}).items()})
    return shown


def resolve_settings(env_cls: Any, argv: Sequence[str]) -> RunSettings:
    """Turn argv (without the program name) into the run's settings."""
    mode = _choose_mode(argv)
    default_env, default_servers = env_cls.config_init()
    env_config_cls = type(default_env)
    teacher_namespace = getattr(env_cls, "teacher_namespace", None)
    flags = available_flags(env_config_cls, teacher_namespace)
    if mode == "check":
        flags[CHECK_GROUPS.name] = CHECK_GROUPS
    if mode == "rescore":
        flags.update({flag.name: flag for flag in RESCORE_FLAGS})
    if "--help" in argv[1:] or "-h" in argv[1:]:
        print(help_text(Path(sys.argv[0]).name, mode, flags, _help_defaults(env_cls, mode, default_env, default_servers)))
        raise SystemExit(0)
    values = parse_flags(list(argv[1:]), flags)
    strict = str(values.get("strict-config", "false")).lower() in TRUE_WORDS
    document = _load_yaml(values.get("config"), env_config_cls, strict)

    env_values = _with_mode_defaults(mode, default_env)
    env_values.update(document.get(ENV_NAMESPACE) or {})
    env_values.update(_namespace(values, ENV_NAMESPACE))
    _fill_derived(env_cls, mode, env_values)
    try:
        env_config = env_config_cls(**env_values)
    except ValidationError as exc:
        raise ConfigError(f"invalid environment settings: {exc}") from None

    cli_openai = _namespace(values, OPENAI_NAMESPACE)
    yaml_openai = document.get(OPENAI_NAMESPACE)
    merged = merged_openai_mapping(default_servers, yaml_openai, cli_openai)
    servers = resolve_openai_configs(default_servers, merged, document, cli_openai, log)

    manager_values = {k: document[k] for k in MANAGER_FLAGS if k in document}
    manager_values.update({k: values[k] for k in MANAGER_FLAGS if k in values})
    try:
        manager = ServerManagerConfig(**manager_values)
    except ValidationError as exc:
        raise ConfigError(f"invalid server manager settings: {exc}") from None
    teacher = _resolve_teacher(env_cls, teacher_namespace, values, document)
    return RunSettings(mode, env_config, servers, manager, Path(values["config"]) if values.get("config") else None,
                       cli_openai, teacher, _names_a_server(cli_openai, yaml_openai), _check_groups(values),
                       {flag.name: values.get(flag.name) for flag in RESCORE_FLAGS} if mode == "rescore" else {})


def _names_a_server(cli_openai: dict[str, Any], yaml_openai: Any) -> bool:
    entries = yaml_openai if isinstance(yaml_openai, list) else [yaml_openai]
    return bool(cli_openai.get("base_url")) or any(isinstance(e, dict) and e.get("base_url") for e in entries)


def _check_groups(values: dict[str, Any]) -> int:
    raw = values.get(CHECK_GROUPS.name, CHECK_GROUPS.default)
    try:
        groups = int(raw)
    except (TypeError, ValueError):
        raise ConfigError(f"--groups takes a whole number, not {raw!r}") from None
    if groups < 1:
        raise ConfigError("--groups must be at least 1")
    return groups


def _resolve_teacher(env_cls: Any, namespace: Optional[str], values: dict[str, Any], document: dict[str, Any]) -> Optional[ServerConfigs]:
    """Teacher server configs from ``--teacher.*`` / YAML ``teacher:`` / ``teacher_config_init()``."""
    if not namespace:
        return None
    default = env_cls.teacher_config_init()
    cli_teacher, yaml_teacher = _namespace(values, namespace), document.get(namespace)
    if default is None and not cli_teacher and not yaml_teacher:
        return None
    base = default if default is not None else APIServerConfig()
    merged = merged_openai_mapping(base, yaml_teacher, cli_teacher)
    return resolve_openai_configs(base, merged, {OPENAI_NAMESPACE: yaml_teacher}, cli_teacher, log)


def describe(settings: RunSettings) -> str:
    servers = settings.server_configs
    shown = [s.model_dump() for s in servers] if isinstance(servers, list) else servers.model_dump()
    return yaml.safe_dump(
        {"env": settings.env_config.model_dump(mode="json"), "openai": shown, **settings.manager.model_dump()},
        sort_keys=False,
    )


def is_plain_baseline(configs: ServerConfigs) -> bool:
    return isinstance(configs, ServerBaseline) and not isinstance(configs, APIServerConfig)
