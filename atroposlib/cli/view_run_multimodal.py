"""`view-run-multimodal`: `view-run` for image-and-text groups.

Everything is `view-run`'s (flags, sources, pages); the page also shows each group's image
and its text prompt instead of the raw prefix (see `viewer_images` for where they are found).
"""

from __future__ import annotations

import argparse
from typing import Optional, Sequence

from atroposlib.cli import view_run
from atroposlib.cli.view_run import check_args, run

PROG = "view-run-multimodal"
DEFAULT_TOKENIZER = "Qwen/Qwen2-VL-2B-Instruct"


def build_parser() -> argparse.ArgumentParser:
    return view_run.build_parser(PROG, DEFAULT_TOKENIZER, what="image-and-text groups")


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    check_args(parser, args)
    return run(args, prog=PROG, multimodal=True)


if __name__ == "__main__":
    raise SystemExit(main())
