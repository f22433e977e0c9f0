"""Loading an environment's tokenizer, or one clear line saying why it cannot be loaded.

A folder is loaded as it is. A Hugging Face id is looked up in the local cache first
(which works offline); only when it is not cached is the hub asked, after a quick check
that it answers, so an offline machine fails at once instead of after a minute of retries.
Local files load through `tokenizer_class_memo` (AutoTokenizer's choice, remembered).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

import httpx

from atroposlib.envs.tokenizer_class_memo import load_with_memo, local_file

HUB_PROBE_TIMEOUT_S = 5.0
ENV_FLAG = "--env.tokenizer_name"
# The option that names the tokenizer of a server that tokenizes itself (server_type vllm, trl).
TOKENIZER_FLAG = "--openai.tokenizer_name"


def fix_hint(flag: str = ENV_FLAG) -> str:
    """How to get a tokenizer loaded, naming the option `flag` that chooses it."""
    return (f"pass {flag} a local folder holding the tokenizer (tokenizer.json, tokenizer_config.json), "
            "or load it once where the hub is reachable so that it is cached; "
            "with HF_HUB_OFFLINE=1 only the cache is used")


class TokenizerUnavailable(OSError):
    """The tokenizer named in the config cannot be loaded (an OSError, as transformers raises)."""


def _first_line(exc: BaseException) -> str:
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return (lines[0] if lines else type(exc).__name__)[:300]


def looks_like_a_path(name: str) -> bool:
    """Whether `name` is meant as a file-system path rather than a Hugging Face id."""
    return name.startswith(("/", "./", "../", "~")) or name.count("/") > 1 or name.endswith("/")


def _hub_problem(endpoint: str) -> Optional[str]:
    """Why the hub cannot be reached, or None when it answers."""
    try:
        httpx.head(endpoint, timeout=HUB_PROBE_TIMEOUT_S)
    except httpx.HTTPError as exc:
        return _first_line(exc) if str(exc) else type(exc).__name__
    return None


def found_locally(name: str) -> bool:
    """Whether tokenizer `name` has its files on this machine (a folder, or the Hugging Face
    cache), known without importing transformers."""
    return local_file(name, "tokenizer_config.json") is not None


def load_tokenizer(name: str, flag: str = ENV_FLAG) -> Any:
    """The tokenizer `name` (a folder or a Hugging Face id); raises `TokenizerUnavailable`,
    whose message names `flag`, the option that chose it."""
    from huggingface_hub import constants

    folder = Path(name).expanduser()
    if folder.exists():
        try:
            return load_with_memo(str(folder))
        except Exception as exc:
            raise TokenizerUnavailable(f"cannot load the tokenizer in {folder}: {_first_line(exc)}") from None
    if looks_like_a_path(name):
        raise TokenizerUnavailable(f"no tokenizer folder at {name}; {fix_hint(flag)}")
    try:
        return load_with_memo(name, local_files_only=True)
    except Exception:
        pass  # not cached: ask the hub below
    if constants.HF_HUB_OFFLINE:
        raise TokenizerUnavailable(f"tokenizer {name!r} is not in the Hugging Face cache and HF_HUB_OFFLINE is set; "
                                   f"{fix_hint(flag)}")
    problem = _hub_problem(constants.ENDPOINT)
    if problem is not None:
        raise TokenizerUnavailable(f"cannot load tokenizer {name!r}: it is not in the Hugging Face cache and "
                                   f"{constants.ENDPOINT} cannot be reached ({problem}); {fix_hint(flag)}")
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(name)
    except Exception as exc:
        raise TokenizerUnavailable(f"cannot load tokenizer {name!r} from {constants.ENDPOINT}: {_first_line(exc)}; "
                                   f"check the name, or {fix_hint(flag)}") from None
