"""Convert a GGUF model file into a plain Hugging Face checkpoint folder.

Runs as a script inside the local inference runtime (which has torch, transformers and
gguf), so it imports nothing from atroposlib:

    python gguf_to_hf.py MODEL.gguf OUT_DIR [--dtype bfloat16]

The weights are de-quantised by transformers and saved as safetensors, together with
the tokenizer and its chat template (both read from the GGUF metadata).
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
from pathlib import Path
from typing import Any


def parse_each_file_once() -> None:
    """transformers reads the GGUF file three times (the config, the tokenizer, the weights),
    parsing all its metadata (the whole vocabulary) each time, and builds the same tensor-name
    map once per module (397 times for SmolLM2-135M): that was most of the conversion's ~36 s
    on 2 cores. Both are looked up where transformers uses them, at call time, so caching them
    here makes each once; neither is changed after it is made."""
    import gguf

    readers: dict[tuple[str, str], Any] = {}
    parse = gguf.GGUFReader

    def cached_reader(path: Any, mode: str = "r") -> Any:
        key = (str(path), mode)
        if key not in readers:
            readers[key] = parse(path, mode)
        return readers[key]

    gguf.GGUFReader = cached_reader
    gguf.get_tensor_name_map = functools.lru_cache(maxsize=None)(gguf.get_tensor_name_map)


def convert(gguf_path: Path, out_dir: Path, dtype: str) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    parse_each_file_once()

    folder, name = str(gguf_path.parent), gguf_path.name
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    loaded = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    if not getattr(tokenizer, "chat_template", None):
        raise SystemExit(f"{gguf_path} carries no chat template; pass a model with one")
    # transformers refuses to save a model loaded from GGUF (it counts as quantised), although
    # its weights are already de-quantised: copy them into a plain model of the same config.
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = AutoModelForCausalLM.from_config(config, dtype=getattr(torch, dtype))
    model.load_state_dict(loaded.state_dict())
    model.generation_config = loaded.generation_config
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    print(json.dumps({"model_dir": str(out_dir), "parameters": sum(p.numel() for p in model.parameters())}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("gguf", type=Path)
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    args = parser.parse_args()
    if not args.gguf.is_file():
        sys.exit(f"error: no GGUF file at {args.gguf}")
    convert(args.gguf, args.out_dir, args.dtype)


if __name__ == "__main__":
    main()
