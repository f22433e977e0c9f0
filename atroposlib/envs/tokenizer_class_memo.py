"""Which tokenizer class ``AutoTokenizer`` chose for a tokenizer's files, remembered on disk.

``AutoTokenizer`` imports transformers' model-configuration code, which imports torch when
torch is installed: 3.5 s of a 5 s environment start on a 2-core CPU, for a tokenizer that
needs no torch. Its choice of class is a function of the tokenizer's files and the
transformers version, so it is made once by ``AutoTokenizer`` itself and remembered here,
keyed by both; later starts load that class directly. Only transformers' own classes are
remembered (never remote code), and a remembered class that fails to load falls back to
``AutoTokenizer``.
"""

from __future__ import annotations

import importlib
import json
import os
from pathlib import Path
from typing import Any, Optional

import platformdirs

# Files whose content decides AutoTokenizer's choice; a change to any of them is a new key.
DECIDING_FILES = ("tokenizer_config.json", "config.json", "tokenizer.json")
MAX_REMEMBERED = 256  # newest kept: checkpoint folders would otherwise grow the file forever


def memo_path() -> Path:
    """The JSON file that maps a tokenizer's key to the class ``AutoTokenizer`` chose."""
    return Path(platformdirs.user_cache_dir("atroposlib")) / "tokenizer_classes.json"


def local_file(name: str, filename: str) -> Optional[Path]:
    """`filename` of the folder `name`, or of the Hugging Face id `name` in the local cache."""
    folder = Path(name).expanduser()
    if folder.is_dir():
        path = folder / filename
        return path if path.is_file() else None
    from huggingface_hub import try_to_load_from_cache

    try:
        cached = try_to_load_from_cache(name, filename)
    except ValueError:  # not a Hugging Face id either (a path to nowhere)
        return None
    return Path(cached) if isinstance(cached, str) else None


def memo_key(name: str) -> Optional[str]:
    """What identifies the files of tokenizer `name` and this transformers; None when its
    tokenizer_config.json is not on this machine."""
    import transformers

    parts = [transformers.__version__]
    for filename in DECIDING_FILES:
        path = local_file(name, filename)
        if path is None and filename == "tokenizer_config.json":
            return None
        if path is not None:
            stat = path.resolve().stat()
            parts.append(f"{path.resolve()}:{stat.st_size}:{stat.st_mtime_ns}")
    return "|".join(parts)


def _read() -> dict[str, str]:
    try:
        memo = json.loads(memo_path().read_text())
    except (OSError, ValueError):
        return {}
    return memo if isinstance(memo, dict) else {}


def remembered_class(key: str) -> Optional[type]:
    """The tokenizer class remembered for `key`, imported; None when none is."""
    dotted = _read().get(key)
    if not isinstance(dotted, str) or not dotted.startswith("transformers."):
        return None
    module_name, _, class_name = dotted.rpartition(".")
    try:
        found = getattr(importlib.import_module(module_name), class_name, None)
    except ImportError:
        return None
    return found if isinstance(found, type) else None


def remember(key: str, tokenizer: Any) -> None:
    """Remember the class of `tokenizer` for `key`, when it is one of transformers' own.
    A cache that cannot be written only costs the next start its speed."""
    cls = type(tokenizer)
    if not cls.__module__.startswith("transformers."):
        return
    memo = _read()
    memo.pop(key, None)
    memo[key] = f"{cls.__module__}.{cls.__qualname__}"
    memo = dict(list(memo.items())[-MAX_REMEMBERED:])
    path = memo_path()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_suffix(f".{os.getpid()}.tmp")
        partial.write_text(json.dumps(memo, indent=0))
        os.replace(partial, path)
    except OSError:
        pass


def load_with_memo(name: str, **kwargs: Any) -> Any:
    """``AutoTokenizer.from_pretrained(name, **kwargs)``, through the remembered class when
    one is remembered for these files."""
    key = memo_key(name)
    known = remembered_class(key) if key is not None else None
    if known is not None:
        try:
            return known.from_pretrained(name, **kwargs)
        except Exception:
            pass  # AutoTokenizer below knows more ways, and raises the error worth showing
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(name, **kwargs)
    if key is not None:
        remember(key, tokenizer)
    return tokenizer
