"""Faulty inputs for editing tasks: a valid instance of a Pydantic model, then errors put into it.

`generate_valid_data` builds JSON-ready data that validates against a model (types, bounds,
lengths, enums and literals, nested models, lists and dicts, e-mail addresses, URLs, UUIDs and
dates). `introduce_error_for_pydantic` copies valid data and applies up to ``max_errors`` errors
of the enabled `ErrorType` kinds (wrong types, broken constraints or formats, values outside an
enum, a missing required field, an extra field, an error inside a nested model or a list, a value
a custom validator refuses); an error counts only when the model really rejects the result.
Randomness comes from a `random.Random` seeded by the config, never from the global generator.
"""

from __future__ import annotations

import copy
import datetime as dt
import itertools
import math
import random
import re
import string
import types
import typing
import uuid
from decimal import Decimal
from enum import Enum
from typing import Any, Callable, Dict, List, Optional, Type, Union

from pydantic import BaseModel, ValidationError

Data = Dict[str, Any]


class ErrorType(Enum):
    """Kinds of errors an editing task can contain."""

    TYPE_ERROR = "type_error"
    CONSTRAINT_ERROR = "constraint_error"
    FORMAT_ERROR = "format_error"
    ENUM_ERROR = "enum_error"
    REQUIRED_FIELD_MISSING = "required_field_missing"
    EXTRA_FIELD = "extra_field"
    NESTED_ERROR = "nested_error"
    LIST_ERROR = "list_error"
    VALIDATOR_ERROR = "validator_error"


DEFAULT_ERROR_TYPES = [ErrorType.TYPE_ERROR, ErrorType.CONSTRAINT_ERROR, ErrorType.FORMAT_ERROR,
                       ErrorType.ENUM_ERROR, ErrorType.REQUIRED_FIELD_MISSING]
MAX_ATTEMPTS = 50


class ErrorIntroductionConfig:
    """Which errors to introduce, how many, how often, and the seed."""

    def __init__(self, error_types: Optional[List[ErrorType]] = None, max_errors: int = 1, probability: float = 1.0,
                 seed: Optional[int] = None) -> None:
        self.error_types = list(DEFAULT_ERROR_TYPES if error_types is None else error_types)
        self.max_errors = max_errors
        self.probability = probability
        self.seed = seed

    @classmethod
    def from_env_config(cls, error_types_enabled: List[str], max_errors_per_item: int = 1,
                        error_introduction_probability: float = 1.0,
                        error_introduction_seed: Optional[int] = None) -> "ErrorIntroductionConfig":
        """From the environment's settings; unknown error names are ignored."""
        known = {kind.value: kind for kind in ErrorType}
        return cls(error_types=[known[name] for name in error_types_enabled if name in known],
                   max_errors=max_errors_per_item, probability=error_introduction_probability,
                   seed=error_introduction_seed)


# -- what a field accepts ------------------------------------------------------------------------
def _unwrap(annotation: Any) -> Any:
    """The annotation without Optional / Annotated around it (the first non-None member of a Union)."""
    while True:
        origin = typing.get_origin(annotation)
        if origin is typing.Annotated:
            annotation = typing.get_args(annotation)[0]
        elif origin in (Union, types.UnionType):
            members = [a for a in typing.get_args(annotation) if a is not type(None)]
            annotation = members[0] if members else str
        else:
            return annotation


def _constraints(field: Any) -> Dict[str, Any]:
    """ge / gt / le / lt / min_length / max_length / pattern of a field, from its metadata."""
    found: Dict[str, Any] = {}
    for item in getattr(field, "metadata", None) or []:
        for name in ("ge", "gt", "le", "lt", "min_length", "max_length", "pattern"):
            value = getattr(item, name, None)
            if value is not None:
                found[name] = value
    return found


def _is_model(annotation: Any) -> bool:
    return isinstance(annotation, type) and issubclass(annotation, BaseModel)


def _is_enum(annotation: Any) -> bool:
    return isinstance(annotation, type) and issubclass(annotation, Enum)


def _choices(annotation: Any) -> Optional[List[Any]]:
    """The allowed values of an Enum or a Literal, else None."""
    if _is_enum(annotation):
        return [member.value for member in annotation]
    if typing.get_origin(annotation) is typing.Literal:
        return list(typing.get_args(annotation))
    return None


def _type_name(annotation: Any) -> str:
    return getattr(annotation, "__name__", str(annotation))


# -- valid data ------------------------------------------------------------------------------------
def _number(annotation: Any, limits: Dict[str, Any], rng: random.Random) -> Union[int, float]:
    step = 1 if annotation is int else 0.01
    low = limits["ge"] if "ge" in limits else limits["gt"] + step if "gt" in limits else None
    high = limits["le"] if "le" in limits else limits["lt"] - step if "lt" in limits else None
    if low is None:
        low = 1 if high is None or high >= 1 else high - 100
    if high is None:
        high = low + 100
    if annotation is int:
        return rng.randint(math.ceil(low), max(math.ceil(low), math.floor(high)))
    return min(max(round(rng.uniform(low, high), 2), low), high)


CATEGORY_CHARS = {"CATEGORY_DIGIT": string.digits, "CATEGORY_WORD": string.ascii_letters + string.digits + "_",
                  "CATEGORY_SPACE": " ", "CATEGORY_NOT_DIGIT": string.ascii_letters,
                  "CATEGORY_NOT_WORD": "-.", "CATEGORY_NOT_SPACE": string.ascii_letters}


def _class_chars(items: List[tuple]) -> str:
    chars = ""
    for op, arg in items:
        name = str(op)
        if name == "LITERAL":
            chars += chr(arg)
        elif name == "RANGE":
            chars += "".join(chr(c) for c in range(arg[0], min(arg[1], arg[0] + 60) + 1))
        elif name == "CATEGORY":
            chars += CATEGORY_CHARS.get(str(arg), "")
    return chars or string.ascii_letters


def _sample_parsed(parsed: Any, rng: random.Random) -> str:
    out = []
    for op, arg in parsed:
        name = str(op)
        if name == "LITERAL":
            out.append(chr(arg))
        elif name == "NOT_LITERAL":
            out.append(next(c for c in string.ascii_letters if ord(c) != arg))
        elif name == "ANY":
            out.append(rng.choice(string.ascii_letters))
        elif name == "IN":
            negated = bool(arg) and str(arg[0][0]) == "NEGATE"
            chars = _class_chars(arg[1:] if negated else arg)
            out.append(rng.choice([c for c in string.ascii_letters + string.digits if c not in chars] if negated
                                  else chars))
        elif name in ("MAX_REPEAT", "MIN_REPEAT", "POSSESSIVE_REPEAT"):
            low, high, body = arg
            out.extend(_sample_parsed(body, rng) for _ in range(rng.randint(low, min(high, low + 3))))
        elif name == "SUBPATTERN":
            out.append(_sample_parsed(arg[-1], rng))
        elif name == "BRANCH":
            out.append(_sample_parsed(rng.choice(arg[1]), rng))
    return "".join(out)


def sample_matching(pattern: str, rng: random.Random) -> Optional[str]:
    """A string matching the regular expression `pattern`, or None when this sampler cannot make one
    (look-arounds, back-references)."""
    try:
        candidate = _sample_parsed(re._parser.parse(pattern), rng)
    except Exception:  # an unusual pattern: let validation decide with the default text
        return None
    return candidate if re.search(pattern, candidate) else None


def _text(name: str, limits: Dict[str, Any], rng: random.Random) -> str:
    if "pattern" in limits:
        sampled = sample_matching(str(limits["pattern"]), rng)
        if sampled is not None:
            return sampled
    lowered = name.lower()
    if "email" in lowered:
        return f"user{rng.randint(1, 99)}@example.com"
    if "url" in lowered or "website" in lowered or "link" in lowered:
        return f"https://example.com/{name}"
    words = ["alpha", "river", "stone", "maple", "copper", "signal", "harbor", "lantern"]
    text = f"{rng.choice(words)} {rng.choice(words)}"
    minimum, maximum = limits.get("min_length", 1), limits.get("max_length")
    text = text.ljust(minimum, "x")
    return text[:maximum] if maximum else text


SPECIAL_VALUES: Dict[str, Callable[[random.Random], Any]] = {
    "EmailStr": lambda rng: f"person{rng.randint(1, 99)}@example.com",
    "HttpUrl": lambda rng: f"https://example.org/item/{rng.randint(1, 999)}",
    "AnyUrl": lambda rng: f"https://example.org/item/{rng.randint(1, 999)}",
    "UUID": lambda rng: str(uuid.UUID(int=rng.getrandbits(128), version=4)),
    "datetime": lambda rng: (dt.datetime(2024, 1, 1) + dt.timedelta(hours=rng.randint(0, 8000))).isoformat(),
    "date": lambda rng: (dt.date(2024, 1, 1) + dt.timedelta(days=rng.randint(0, 300))).isoformat(),
    "time": lambda rng: f"{rng.randint(0, 23):02d}:{rng.randint(0, 59):02d}:00",
    "timedelta": lambda rng: rng.randint(60, 3600),
    "Decimal": lambda rng: round(rng.uniform(1, 100), 2),
}


def _value(annotation: Any, name: str, limits: Dict[str, Any], rng: random.Random, depth: int) -> Any:
    annotation = _unwrap(annotation)
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    choices = _choices(annotation)
    if choices is not None:
        return rng.choice(choices)
    if _is_model(annotation):
        return generate_valid_data(annotation, rng, depth + 1)
    if origin in (list, set, tuple, List) or annotation in (list, set, tuple):
        count = max(limits.get("min_length", 1), 1)
        count = min(count + rng.randint(0, 1), limits.get("max_length", count + 1))
        item = args[0] if args else str
        return [_value(item, f"{name}_item", {}, rng, depth + 1) for _ in range(count)]
    if origin is dict or annotation is dict:
        value_type = args[1] if len(args) > 1 else str
        return {f"key{i}": _value(value_type, f"{name}_value", {}, rng, depth + 1) for i in range(2)}
    if annotation is bool:
        return rng.choice([True, False])
    if annotation in (int, float):
        return _number(annotation, limits, rng)
    if _type_name(annotation) in SPECIAL_VALUES:
        return SPECIAL_VALUES[_type_name(annotation)](rng)
    return _text(name, limits, rng)


def generate_valid_data(model: Type[BaseModel], rng: Optional[random.Random] = None, depth: int = 0,
                        attempts: int = 5) -> Optional[Data]:
    """JSON-ready data that `model` accepts (optional fields included about two times in three),
    or None when none of `attempts` tries validates."""
    rng = rng or random.Random()
    for _ in range(attempts):
        data: Data = {}
        for name, field in model.model_fields.items():
            if not field.is_required() and (depth > 2 or rng.random() < 0.3):
                continue
            key = field.alias or name
            data[key] = _value(field.annotation, name, _constraints(field), rng, depth)
        try:
            model.model_validate(data)
        except ValidationError:
            continue
        return data
    return None


# -- errors ----------------------------------------------------------------------------------------
Mutation = Callable[[Data, Type[BaseModel], random.Random], bool]


def _fields_present(data: Data, model: Type[BaseModel]) -> List[tuple]:
    return [((field.alias or name), field) for name, field in model.model_fields.items()
            if (field.alias or name) in data]


def _type_error(data: Data, model: Type[BaseModel], rng: random.Random) -> bool:
    for key, _ in rng.sample(_fields_present(data, model), len(_fields_present(data, model))):
        value = data[key]
        replacement = {str: [value], bool: "perhaps", int: "twelve", float: "a lot", list: "not a list",
                       dict: "not an object"}.get(type(value))
        if replacement is not None:
            data[key] = replacement
            return True
    return False


def _constraint_error(data: Data, model: Type[BaseModel], rng: random.Random) -> bool:
    for key, field in _fields_present(data, model):
        limits, value = _constraints(field), data[key]
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            if "ge" in limits or "gt" in limits:
                data[key] = limits.get("ge", limits.get("gt")) - 1
                return True
            if "le" in limits or "lt" in limits:
                data[key] = limits.get("le", limits.get("lt")) + 1
                return True
        if isinstance(value, (str, list)):
            if "max_length" in limits:
                data[key] = value * (limits["max_length"] + 1) if value else "x" * (limits["max_length"] + 1)
                return True
            if limits.get("min_length", 0) > 0:
                data[key] = value[: limits["min_length"] - 1]
                return True
    return False


def _format_error(data: Data, model: Type[BaseModel], rng: random.Random) -> bool:
    broken = {"EmailStr": "person.example.com", "HttpUrl": "not a web address", "AnyUrl": "::nowhere::",
              "UUID": "1234-not-a-uuid", "datetime": "the 45th of Smarch", "date": "2024-13-45",
              "time": "25:99", "Decimal": "one point five"}
    for key, field in _fields_present(data, model):
        name = _type_name(_unwrap(field.annotation))
        if name in broken:
            data[key] = broken[name]
            return True
        if "pattern" in _constraints(field) and isinstance(data[key], str):
            data[key] = "!!" + data[key][::-1] + "??"
            return True
    return False


def _enum_error(data: Data, model: Type[BaseModel], rng: random.Random) -> bool:
    for key, field in _fields_present(data, model):
        choices = _choices(_unwrap(field.annotation))
        if choices:
            data[key] = f"not_{choices[0]}_{rng.randint(100, 999)}"
            return True
    return False


def _required_field_missing(data: Data, model: Type[BaseModel], rng: random.Random) -> bool:
    required = [key for key, field in _fields_present(data, model) if field.is_required()]
    if not required:
        return False
    del data[rng.choice(required)]
    return True


def _extra_field(data: Data, model: Type[BaseModel], rng: random.Random) -> bool:
    data[f"unexpected_{rng.randint(100, 999)}"] = "should not be here"
    return True


def _nested_error(data: Data, model: Type[BaseModel], rng: random.Random) -> bool:
    """An error inside a nested model, or inside the first model of a list of models."""
    for key, field in _fields_present(data, model):
        inner, value = _unwrap(field.annotation), data[key]
        if typing.get_origin(inner) is list and typing.get_args(inner) and isinstance(value, list) and value:
            inner, value = _unwrap(typing.get_args(inner)[0]), value[0]
        if _is_model(inner) and isinstance(value, dict):
            mutation = rng.choice([_type_error, _required_field_missing, _constraint_error, _enum_error])
            return mutation(value, inner, rng)
    return False


def _list_error(data: Data, model: Type[BaseModel], rng: random.Random) -> bool:
    for key, _ in _fields_present(data, model):
        value = data[key]
        if isinstance(value, list) and value:
            item = value[0]
            intruder = {str: {"wrong": "item"}, int: "not a number", float: "not a number", bool: "maybe",
                        dict: "not an object"}.get(type(item), None)
            data[key] = value + [intruder]
            return True
    return False


def _validator_error(data: Data, model: Type[BaseModel], rng: random.Random) -> bool:
    """A value a custom validator refuses: awkward values for fields with field validators, and for
    models with model validators, two values of the same kind swapped (an end before its start)."""
    decorators = getattr(model, "__pydantic_decorators__", None)
    validated = set()
    for decorator in getattr(decorators, "field_validators", {}).values():
        validated.update(getattr(decorator.info, "fields", ()))
    trials = [(key, candidate) for key, _ in _fields_present(data, model) if key in validated
              for candidate in ("", " ", -1, 0, 10**9, "x" * 500)]
    for key, candidate in trials:
        if _rejects(model, dict(data, **{key: candidate})):
            data[key] = candidate
            return True
    if getattr(decorators, "model_validators", None):
        keys = [key for key, _ in _fields_present(data, model)]
        for first, second in itertools.combinations(keys, 2):
            if type(data[first]) is type(data[second]) and data[first] != data[second]:
                swapped = dict(data, **{first: data[second], second: data[first]})
                if _rejects(model, swapped):
                    data[first], data[second] = data[second], data[first]
                    return True
    return False


MUTATIONS: Dict[ErrorType, Mutation] = {
    ErrorType.TYPE_ERROR: _type_error, ErrorType.CONSTRAINT_ERROR: _constraint_error,
    ErrorType.FORMAT_ERROR: _format_error, ErrorType.ENUM_ERROR: _enum_error,
    ErrorType.REQUIRED_FIELD_MISSING: _required_field_missing, ErrorType.EXTRA_FIELD: _extra_field,
    ErrorType.NESTED_ERROR: _nested_error, ErrorType.LIST_ERROR: _list_error,
    ErrorType.VALIDATOR_ERROR: _validator_error,
}


def _rejects(model: Type[BaseModel], data: Data) -> bool:
    try:
        model.model_validate(data)
    except ValidationError:
        return True
    return False


def introduce_error_for_pydantic(data: Any, pydantic_model: Type[BaseModel],
                                 config: Optional[ErrorIntroductionConfig] = None,
                                 seed: Optional[int] = None) -> Optional[Any]:
    """A copy of `data` with up to ``config.max_errors`` errors `pydantic_model` rejects, or None when
    the probability draw says no, `data` is not a mapping, or no enabled error applies."""
    config = config or ErrorIntroductionConfig()
    rng = random.Random(config.seed if seed is None else seed)
    if not isinstance(data, dict) or not config.error_types or rng.random() > config.probability:
        return None
    faulty = copy.deepcopy(data)
    kinds = list(config.error_types)
    rng.shuffle(kinds)
    introduced = 0
    for attempt in range(MAX_ATTEMPTS):
        if introduced >= config.max_errors:
            break
        candidate = copy.deepcopy(faulty)
        mutation = MUTATIONS[kinds[attempt % len(kinds)]]
        try:
            changed = mutation(candidate, pydantic_model, rng)
        except Exception:  # a mutation that does not fit this model's shapes is just skipped
            continue
        if changed and candidate != faulty and _rejects(pydantic_model, candidate):
            faulty, introduced = candidate, introduced + 1
    return faulty if introduced else None
