"""The run shared by ``atropos-sft-gen`` and ``atropos-dpo-gen``: scored groups in, dataset rows out.

A run checks its output file first (before any server is touched), loads the tokenizer
(text rows only), takes groups from the API (`ApiBatchSource`: no reset unless asked, no
stealing from a registered trainer unless forced) or from a ``process`` JSONL file, turns
each group into rows with the tool's selection rule, and writes them with a progress bar
until ``--num-seqs-to-save`` rows are written. From the API every row of a batch taken is
written (the batch is acknowledged only then), so a run may end a little past the target,
as Atropos's tools do. Ctrl-C or SIGTERM stops it with the file flushed and unfinished
batches given back. A provenance record (``<output>.provenance.json``) says where the rows
came from, how they were filtered and how many there are.
"""

from __future__ import annotations

import argparse
import datetime
import json
import signal
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Callable, Optional

import jsonlines
from tqdm import tqdm

from atroposlib.cli.batch_source import ApiBatchSource, Batch, JsonlBatchSource, ToolRefused, registration
from atroposlib.cli.group_text import load_tool_tokenizer
from atroposlib.envs.tokenizer_loading import TokenizerUnavailable
from atroposlib.local.signals import StopSignal, stop_signals_raise

DEFAULT_TOKENIZER = "NousResearch/DeepHermes-3-Llama-3-8B-Preview"
SelectRows = Callable[[Any, dict[str, Any]], list[dict[str, Any]]]


def add_common_arguments(parser: argparse.ArgumentParser, *, min_diff_default: float) -> None:
    """The flags both tools share (Atropos's names and defaults, then this project's)."""
    parser.add_argument("filepath", type=str,
                        help="JSONL file to write the rows to (refused if it exists, unless --append-to-previous).")
    parser.add_argument("--api-url", type=str, default="http://localhost:8000", help="Trajectory API to read from.")
    parser.add_argument("--group-size", type=int, default=2, help="Rollouts per group (sets the registered batch size).")
    parser.add_argument("--max-token-len", type=int, default=2048, help="max_token_len registered with the API.")
    parser.add_argument("--tokenizer", type=str, default=DEFAULT_TOKENIZER,
                        help="Tokenizer (Hugging Face id or folder) that decodes the tokens into text rows; "
                             "not loaded with --save-messages.")
    parser.add_argument("--save-messages", action="store_true",
                        help="Write the groups' chat messages instead of decoded text (the environment must send messages).")
    parser.add_argument("--num-seqs-to-save", type=int, default=100,
                        help="Stop once this many rows are written (from the API, every row of the last batch taken "
                             "is written).")
    parser.add_argument("--allow-negative-scores", action="store_true", help="Keep rollouts scoring 0 or less.")
    parser.add_argument("--minimum-score-diff-max-min", type=float, default=min_diff_default,
                        help="Score margin a kept row needs: over the group's worst rollout (sft), or of a pair's "
                             "chosen over its rejected (dpo).")
    parser.add_argument("--append-to-previous", action="store_true", help="Append to FILEPATH when it exists.")
    parser.add_argument("--from-jsonl", type=Path, metavar="PATH",
                        help="Read groups from this `process` JSONL file instead of the API.")
    parser.add_argument("--reset", action="store_true",
                        help="Wipe the API's run before registering (Atropos's tools always did).")
    parser.add_argument("--force", action="store_true",
                        help="Take batches even though a trainer is registered (they are then lost to it); "
                             "without it the tool refuses (exit 2).")


@dataclass
class DatasetRun:
    """One tool run: what to write where, from which source, and the counts so far."""

    tool: str
    output: Path
    args: argparse.Namespace
    select_rows: SelectRows
    registration: dict[str, Any]
    counts: Counter = field(default_factory=Counter)
    env_ids: Counter = field(default_factory=Counter)
    started: str = field(default_factory=lambda: _now())
    outcome: str = "stopped"
    best_score: float = float("-inf")

    def write_group(self, writer: jsonlines.Writer, tokenizer: Any, group: dict[str, Any]) -> int:
        """Write the rows of `group`; returns how many."""
        if self.args.save_messages and not group.get("messages"):
            raise ToolRefused("a group has no messages: the environment does not send them (drop --save-messages)")
        rows = self.select_rows(tokenizer, group)
        for row in rows:
            writer.write(row)
        self.counts["groups"] += 1
        self.counts["rollouts"] += len(group.get("scores") or [])
        self.counts["rows"] += len(rows)
        self.env_ids[str(group.get("env_id"))] += 1
        scores = list(group.get("scores") or [])
        if scores:
            self.best_score = max(self.best_score, max(scores))
            self.counts["varied_groups"] += max(scores) != min(scores)
        return len(rows)

    def why_no_rows(self) -> str:
        """Why groups were read but no row was written: the filter that left every rollout out."""
        if not self.args.allow_negative_scores and self.best_score <= 0:
            return (f"every rollout scored 0 or less (best {self.best_score:g}) and such rollouts are left out "
                    "(--allow-negative-scores keeps them)")
        if self.counts["varied_groups"] == 0 and self.tool.endswith("dpo-gen"):
            return "no group has rollouts with different scores: a pair needs a better and a worse answer"
        return (f"no rollout passed --minimum-score-diff-max-min {self.args.minimum_score_diff_max_min:g} "
                "(lower it to keep more)")


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def check_output(path: Path, append: bool) -> None:
    """Refuse an output that exists (unless appending) or cannot be written, before any work."""
    if path.is_dir():
        raise ToolRefused(f"{path} is a directory; give a file name")
    if path.exists() and not append:
        raise ToolRefused(f"{path} already exists; pass --append-to-previous to add to it, or choose another name")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("a", encoding="utf-8"):
            pass
    except OSError as err:
        raise ToolRefused(f"cannot write {path}: {err.strerror or err}") from None


def run(tool: str, args: argparse.Namespace, select_rows: SelectRows, registration_body: dict[str, Any]) -> int:
    """Run the tool; returns its exit status (0 done, 2 refused, 128+N stopped by signal N)."""
    output = Path(args.filepath)
    job = DatasetRun(tool, output, args, select_rows, registration_body)
    existed = output.exists()
    try:
        check_output(output, args.append_to_previous)
        source = _open_source(job)
        tokenizer = None if args.save_messages else load_tool_tokenizer(args.tokenizer)
        with stop_signals_raise(), output.open("a" if existed else "w", encoding="utf-8") as file:
            try:
                _collect(job, source, tokenizer, file)
                job.outcome = "complete"
            finally:
                file.flush()
                if job.counts["groups"]:
                    write_provenance(job)
    except StopSignal as stop:
        print(f"{tool}: stopped by {stop.signal_name}; {job.counts['rows']} rows in {output}", file=sys.stderr)
        return 128 + getattr(signal, stop.signal_name)
    except (ToolRefused, TokenizerUnavailable, FileNotFoundError, ValueError) as err:
        print(f"{tool}: {err}", file=sys.stderr)
        if not existed and output.exists() and output.stat().st_size == 0:
            output.unlink()  # refused before writing anything: leave no empty file behind
        return 2
    print(f"{tool}: {job.counts['rows']} rows from {job.counts['groups']} groups written to {output}")
    if job.counts["groups"] and not job.counts["rows"]:
        print(f"{tool}: no rows: {job.why_no_rows()}", file=sys.stderr)
    return 0


def _open_source(job: DatasetRun) -> ApiBatchSource | JsonlBatchSource:
    if job.args.from_jsonl is not None:
        return JsonlBatchSource(job.args.from_jsonl)
    return ApiBatchSource(job.args.api_url, log=lambda line: tqdm.write(f"{job.tool}: {line}"))


def _collect(job: DatasetRun, source: ApiBatchSource | JsonlBatchSource, tokenizer: Any, file: IO[str]) -> None:
    writer = jsonlines.Writer(file)
    target = job.args.num_seqs_to_save
    with tqdm(total=target, desc=f"{job.tool}: rows", unit="row", dynamic_ncols=True) as bar:
        def write(groups: list[dict[str, Any]]) -> None:
            for group in groups:
                bar.update(job.write_group(writer, tokenizer, group))
            file.flush()

        if isinstance(source, JsonlBatchSource):
            for group in source.groups():
                write([group])
                if job.counts["rows"] >= target:
                    return
            print(f"{job.tool}: {source.path} ran out after {job.counts['rows']} of {target} rows", file=sys.stderr)
            return
        try:
            source.claim(job.registration, reset=job.args.reset, force=job.args.force)
            while job.counts["rows"] < target:
                batch: Batch = source.next_batch()
                write(batch.groups)
                source.ack(batch)  # only once its rows are on disk
        finally:
            source.close()


def write_provenance(job: DatasetRun) -> Path:
    """Add this run's record to ``<output>.provenance.json`` (one record per run, oldest first)."""
    path = job.output.with_name(job.output.name + ".provenance.json")
    runs: list[dict[str, Any]] = []
    if path.exists():
        try:
            runs = json.loads(path.read_text(encoding="utf-8")).get("runs", [])
        except (json.JSONDecodeError, AttributeError):
            runs = []
    args = job.args
    runs.append({
        "tool": job.tool,
        "started": job.started,
        "finished": _now(),
        "outcome": job.outcome,
        "output": str(job.output),
        "source": {"jsonl": str(args.from_jsonl)} if args.from_jsonl else {"api_url": args.api_url, "reset": args.reset,
                                                                         "force": args.force},
        "environments": {"groups_by_env_id": dict(job.env_ids)},
        "filters": {key: value for key, value in vars(args).items()
                    if key not in ("filepath", "api_url", "from_jsonl", "reset", "force", "tokenizer")},
        "tokenizer": None if args.save_messages else args.tokenizer,
        "counts": {"groups": job.counts["groups"], "rollouts": job.counts["rollouts"], "rows": job.counts["rows"]},
    })
    path.write_text(json.dumps({"runs": runs}, indent=2, default=str) + "\n", encoding="utf-8")
    return path


def default_registration(batch_size: int, args: argparse.Namespace) -> dict[str, Any]:
    """The /register body of a dataset tool (num_steps: twice the rows wanted, as a buffer)."""
    return registration(batch_size, args.max_token_len, args.num_seqs_to_save * 2)


def parse(parser: argparse.ArgumentParser, argv: Optional[list[str]]) -> argparse.Namespace:
    """Parsed flags; values that cannot work are usage errors (exit 2) here."""
    args = parser.parse_args(argv)
    for flag in ("group_size", "num_seqs_to_save"):
        if getattr(args, flag) < 1:
            parser.error(f"--{flag.replace('_', '-')} must be at least 1")
    return args
