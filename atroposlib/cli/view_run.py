"""`view-run`: look at the scored groups of a run in the browser (a local Gradio app).

Groups come from a `process` JSONL file (``--jsonl``, no API involved) or from the trajectory
API. From the API the viewer never takes data a trainer needs: when no trainer is registered
it registers itself (without wiping the run unless ``--reset``) and takes whole leased
batches; when one is, it refuses unless ``--attach``, which only peeks at the group the API
queued last (or ``--force``). The app listens on 127.0.0.1 and makes no public link unless
``--share``.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import signal
import sys
from types import FrameType
from typing import Any, Optional, Sequence

from atroposlib.cli.batch_source import ApiBatchSource, JsonlBatchSource, ToolRefused, registration
from atroposlib.cli.group_text import load_tool_tokenizer
from atroposlib.cli.viewer_feed import Entry, GroupFeed, batch_fetcher, latest_example_fetcher

PROG = "view-run"
DEFAULT_TOKENIZER = "NousResearch/DeepHermes-3-Llama-3-8B-Preview"
REGISTERED_STEPS = 69  # the num_steps Atropos's viewer registers
BATCH_GROUPS = 8  # registered batch size = group size x this, as in Atropos
FETCH_WAIT_S = 15.0  # how long one "Grab Next Batch" click waits for the API to form a batch
MAX_SLOTS = 64  # rollout rows on the page; bigger groups show their first rollouts and say so
INSTALL_HINT = "the viewer needs Gradio: pip install 'atroposlib[examples]'"


def build_parser(prog: str = PROG, tokenizer: str = DEFAULT_TOKENIZER,
                 what: str = "scored groups") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog,
        description=f"Show the {what} of a run in a local web page: every group of a batch, its scores "
                    "(best highlighted), the prompt, each completion and its trained tokens.")
    parser.add_argument("--port", type=int, default=9001, help="port of the web page (default: %(default)s)")
    parser.add_argument("--host", default="127.0.0.1", help="address the page listens on (default: %(default)s)")
    parser.add_argument("--share", action="store_true", help="also publish a public Gradio share link (Atropos's viewer always did)")
    parser.add_argument("--group-size", type=int, default=2,
                        help=f"rollouts per group; the registered batch size is this x {BATCH_GROUPS} "
                             "(default: %(default)s)")
    parser.add_argument("--max-token-len", type=int, default=2048,
                        help="registered max_token_len (default: %(default)s)")
    parser.add_argument("--tokenizer", default=tokenizer,
                        help="decodes the token lists: a hub id or a folder (default: %(default)s)")
    parser.add_argument("--api-url", default="http://localhost:8000", help="trajectory API (default: %(default)s)")
    parser.add_argument("--jsonl", metavar="PATH", help="show the groups of this `process` JSONL file (no API)")
    parser.add_argument("--attach", action="store_true",
                        help="a trainer is registered: only peek at GET /latest_example, take no batches")
    parser.add_argument("--force", action="store_true", help="take batches even though a trainer is registered")
    parser.add_argument("--reset", action="store_true", help="wipe the API's run before registering")
    return parser


def check_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    if args.group_size < 1:
        parser.error("--group-size must be at least 1")
    api_only = [flag for flag in ("attach", "force", "reset") if getattr(args, flag)]
    if args.jsonl and api_only:
        parser.error(f"--{api_only[0]} is about the API; --jsonl reads a file and contacts no API")
    if args.attach and (args.reset or args.force):
        parser.error("--attach only looks at the run; it cannot be combined with --reset or --force")


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    check_args(parser, args)
    return run(args, prog=PROG, multimodal=False)


class _Stop:
    """Turns SIGTERM into KeyboardInterrupt, so both stop the app the same way; remembers which."""

    signum = signal.SIGINT

    def __call__(self, signum: int, frame: Optional[FrameType]) -> None:
        self.signum = signal.Signals(signum)
        raise KeyboardInterrupt


def run(args: argparse.Namespace, *, prog: str, multimodal: bool) -> int:
    """Start the viewer the parsed `args` ask for; the exit status (2 refused, 130/143 stopped)."""
    stop = _Stop()
    previous_handler = signal.signal(signal.SIGTERM, stop)
    source: Optional[ApiBatchSource] = None

    def say(line: str) -> None:
        print(f"{prog}: {line}", flush=True)

    try:
        _require_gradio()
        if args.jsonl:
            tokenizer = _load_tokenizer(args.tokenizer, prog)
            feed, title = _jsonl_feed(args.jsonl, tokenizer), f"{prog}: {os.path.basename(args.jsonl)}"
        else:
            source = ApiBatchSource(args.api_url, log=say)
            _refuse_to_steal(source, args)  # before the slow start-up, so a refusal is quick
            tokenizer = _load_tokenizer(args.tokenizer, prog)
            feed, title = _api_feed(source, args)
        from atroposlib.cli import viewer_app

        options = viewer_app.ViewerOptions(
            title=title, slots=min(MAX_SLOTS, max(args.group_size, feed.largest_group())), multimodal=multimodal,
            fetch_label="Show Latest Example" if args.attach else "Grab Next Batch", fetch_on_load=args.attach)
        demo = viewer_app.build_demo(viewer_app.GroupPage(feed, tokenizer, options))
        viewer_app.serve(demo, host=args.host, port=args.port, share=args.share, announce=say)
    except ToolRefused as err:
        print(f"{prog}: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 128 + stop.signum
    finally:
        signal.signal(signal.SIGTERM, previous_handler)
        if source is not None:
            source.close()
    return 0


def _require_gradio() -> None:
    """`ToolRefused` saying how to install Gradio when it is missing (it is an optional extra)."""
    if importlib.util.find_spec("gradio") is None:
        raise ToolRefused(INSTALL_HINT)
    os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")  # no phoning home from a local tool


def _load_tokenizer(name: str, prog: str) -> Any:
    """The tokenizer, or None (said on stderr) when it cannot be loaded: groups that carry
    their messages can still be shown."""
    try:
        return load_tool_tokenizer(name)
    except OSError as err:
        print(f"{prog}: {err}; showing groups from their messages where they have them", file=sys.stderr)
        return None


def _jsonl_feed(path: str, tokenizer: Any) -> GroupFeed:
    try:
        name = os.path.basename(path)
        entries = [Entry(group, name) for group in JsonlBatchSource(path).groups()]
    except (OSError, ValueError) as err:
        raise ToolRefused(str(err)) from None
    if not entries:
        raise ToolRefused(f"{path} holds no groups")
    if tokenizer is None and not any(entry.group.get("messages") for entry in entries):
        raise ToolRefused(f"no tokenizer to decode {path}, and its groups have no messages (see --tokenizer)")
    return GroupFeed(entries)


def _refuse_to_steal(source: ApiBatchSource, args: argparse.Namespace) -> None:
    if not args.attach and not args.force and source.trainer_registered():
        raise ToolRefused(f"a training run is registered at {source.url}; taking batches would steal the "
                          "trainer's data. Pass --attach to only peek at its latest group (GET /latest_example), "
                          "or --force to take batches anyway")


def _api_feed(source: ApiBatchSource, args: argparse.Namespace) -> tuple[GroupFeed, str]:
    """The feed from the API and the page title: peeking when attached, else registering to take batches."""
    if args.attach:
        title = f"{source.url}: latest example (attached, no batches taken)"
        return GroupFeed(fetch=latest_example_fetcher(source)), title
    batch_size = args.group_size * BATCH_GROUPS
    source.claim(registration(batch_size, args.max_token_len, REGISTERED_STEPS), reset=args.reset, force=args.force)
    title = f"{source.url}: batches (registered, batch size {batch_size})"
    return GroupFeed(fetch=batch_fetcher(source, FETCH_WAIT_S)), title


if __name__ == "__main__":
    raise SystemExit(main())
