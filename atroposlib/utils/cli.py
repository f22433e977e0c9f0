"""Helpers for building namespaced command lines from pydantic models."""

from __future__ import annotations

import copy
import difflib
import sys
import typing
from dataclasses import dataclass
from typing import Any, Optional, Sequence

from pydantic import BaseModel, create_model

TRUE_WORDS, FALSE_WORDS = {"true", "1", "yes", "on"}, {"false", "0", "no", "off"}


class ConfigError(ValueError):
    """The command line or YAML cannot be turned into a valid configuration."""


@dataclass
class Flag:
    name: str
    annotation: Any
    default: Any
    help: str

    @property
    def is_bool(self) -> bool:
        return self.annotation is bool or (
            typing.get_origin(self.annotation) is typing.Union and bool in typing.get_args(self.annotation)
        )


def _looks_like_value(token: str) -> bool:
    if not token.startswith("-"):
        return True
    try:
        float(token)
        return True
    except ValueError:
        return False


def parse_flags(tokens: Sequence[str], flags: dict[str, Flag]) -> dict[str, Any]:
    """Raw flag values by name; raises `ConfigError` for unknown or malformed flags."""
    values: dict[str, Any] = {}
    i = 0
    while i < len(tokens):
        token = tokens[i]
        if not token.startswith("--"):
            raise ConfigError(f"unexpected argument {token!r}")
        name, has_value, value = token[2:].partition("=")
        spec = flags.get(name)
        if spec is None:
            close = difflib.get_close_matches(name, flags, n=1)
            hint = f"; did you mean --{close[0]}?" if close else ""
            raise ConfigError(f"unknown option --{name}{hint}")
        if not has_value:
            following = tokens[i + 1] if i + 1 < len(tokens) else None
            if spec.is_bool:
                if following is not None and following.lower() in TRUE_WORDS | FALSE_WORDS | {"none"}:
                    value, i = following, i + 1
                else:
                    value = "true"
            elif following is not None and _looks_like_value(following):
                value, i = following, i + 1
            else:
                raise ConfigError(f"--{name} needs a value")
        values[name] = None if value == "None" else value
        i += 1
    return values




def get_prefixed_pydantic_model(model: type[BaseModel], prefix: str) -> type[BaseModel]:
    """A model named ``{Prefix}{Model}`` whose fields are ``prefix + name``."""
    fields: dict[str, Any] = {}
    for name, info in model.model_fields.items():
        field = copy.copy(info)
        fields[f"{prefix}{name}"] = (info.annotation, field)
    return create_model(f"{prefix.capitalize()}{model.__name__}", **fields)


def merge_dicts(*dicts: dict[str, Any]) -> dict[str, Any]:
    """Merge left to right (later wins), nested dicts recursively; inputs are not changed."""
    merged: dict[str, Any] = {}
    for source in dicts:
        for key, value in source.items():
            if isinstance(value, dict) and isinstance(merged.get(key), dict):
                merged[key] = merge_dicts(merged[key], value)
            else:
                merged[key] = copy.deepcopy(value)
    return merged


def extract_namespace(model_or_dict: Any, prefix: str) -> dict[str, Any]:
    """Keys that start with `prefix`, with the prefix removed."""
    if isinstance(model_or_dict, BaseModel):
        data = model_or_dict.model_dump()
    elif hasattr(model_or_dict, "to_dict"):
        data = model_or_dict.to_dict()
    elif isinstance(model_or_dict, dict):
        data = model_or_dict
    else:
        raise TypeError(f"cannot read a namespace from {type(model_or_dict).__name__}")
    return {key[len(prefix):]: value for key, value in data.items() if key.startswith(prefix)}


def adjust_model_defaults(model_class: type[BaseModel], defaults: dict[str, Any]) -> type[BaseModel]:
    """A subclass ``{Name}WithDefaults`` of `model_class` with other defaults."""
    fields: dict[str, Any] = {}
    for name, value in defaults.items():
        info = copy.copy(model_class.model_fields[name])
        if value is None and info.default_factory is not None:
            fields[name] = (info.annotation, info)
            continue
        info.default, info.default_factory = value, None
        fields[name] = (info.annotation, info)
    return create_model(f"{model_class.__name__}WithDefaults", __base__=model_class, **fields)


def get_double_dash_flags(argv: Optional[Sequence[str]] = None) -> dict[str, Any]:
    """Every ``--key value`` / ``--key=value`` / bare ``--flag`` (true) of `argv`
    (default: sys.argv, after the subcommand), with the environment command line's syntax."""
    tokens = list(sys.argv[1:] if argv is None else argv)
    if tokens and not tokens[0].startswith("--"):
        tokens = tokens[1:]
    names = {t[2:].split("=", 1)[0] for t in tokens if t.startswith("--")}
    flags = {}
    for i, token in enumerate(tokens):
        if token.startswith("--") and "=" not in token:
            following = tokens[i + 1] if i + 1 < len(tokens) else None
            takes_value = following is not None and _looks_like_value(following)
            flags[token[2:]] = Flag(token[2:], str if takes_value else bool, None, "")
    flags.update({n: Flag(n, str, None, "") for n in names if n not in flags})
    return parse_flags(tokens, flags)
