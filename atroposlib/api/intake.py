"""Storing checked groups: idempotency, the mixed-size buffers and their hygiene.

A group whose size differs from its env's registered ``group_size`` waits in that env's
buffer until buffered groups add up to exactly one group's worth; they are then queued
individually (Atropos's rule). Unlike Atropos, nothing stays buffered forever: larger
groups are queued at once, and the buffer is flushed by age and by size.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from typing import Any, Optional

import orjson

from atroposlib.api.errors import ApiError
from atroposlib.api.group_checks import Problem
from atroposlib.api.packing import subset_indices_summing_to
from atroposlib.api.problems import ProblemLedger
from atroposlib.api.queue import Entry
from atroposlib.api.state import RunState
from atroposlib.api.validation import Submission

log = logging.getLogger("atroposlib.api")

MAX_REMEMBERED_SUBMISSIONS = 1_000_000


class Intake:
    """Stores submitted groups into a `RunState`."""

    def __init__(self, state: RunState, ledger: ProblemLedger) -> None:
        self.state = state
        self.ledger = ledger

    def review(self, submission: Submission, where: str = "body") -> None:
        """Check a submission against the run (its env is registered, no sequence is
        longer than the trainer's ``max_token_len``); in ``strict`` refuse it (404 / 409),
        in ``warn`` record these and the submission's own problems."""
        level = self.state.settings.validation
        if level == "off":
            return
        found = self._run_problems(submission, where)
        if level == "strict" and found:
            status, code = {"unknown_env": (404, "unknown_env")}.get(found[0].reason, (409, "sequence_too_long"))
            raise ApiError(status, code, found[0].text(), {"field": found[0].field})
        submission.problems += found
        self.ledger.record(submission.problems)

    def _run_problems(self, submission: Submission, where: str) -> list[Problem]:
        state = self.state
        found = []
        if submission.env_id is not None and state.env_index(submission.env_id) is None:
            found.append(Problem("unknown_env", f"{where}.env_id", f"{submission.env_id} is not a registered env"))
        limit = state.config.max_token_len if state.config else 0
        if limit > 0 and submission.longest > limit:
            found.append(Problem(
                "sequence_too_long", f"{where}.tokens",
                f"a sequence of {submission.longest} tokens is longer than the trainer's max_token_len {limit}",
            ))
        return found

    def submit(self, submission: Submission, key: Optional[str], stored: bytes) -> dict[str, Any]:
        """Store one checked group (`stored`: its bytes as they will be kept); the
        caller holds the journal transaction and has called `review`."""
        state = self.state
        repeated = self.repeat_answer(key)
        if repeated is not None:
            self._count(submission.env_id, "duplicate")
            return repeated
        env_index = state.env_index(submission.env_id)
        warnings = list(submission.warnings)
        entry = Entry(
            state.next_seq, submission.size, submission.env_id, state.clock(),
            policy_version=submission.policy_version,
        )
        state.next_seq += 1
        if env_index is None or entry.size == state.envs[env_index].group_size:
            response = self._queue_new(entry, stored)
        elif entry.size > state.envs[env_index].group_size:
            warnings.append(
                f"group of {entry.size} sequences is larger than env {env_index}'s "
                f"group_size {state.envs[env_index].group_size}: queued as it is"
            )
            response = self._queue_new(entry, stored)
        else:
            response = self._buffer(env_index, entry, stored)
        state.touch_env(env_index)
        if warnings:
            response["warnings"] = warnings
        if key is not None:
            self.remember(key, response)
        return response

    def _queue_new(self, entry: Entry, payload: bytes) -> dict[str, Any]:
        state = self.state
        pos = state.queue.append(entry)
        state.pending.add(entry)
        state.journal.insert_item(
            entry.seq, pos, "queued", entry.env_id, entry.size, entry.t, payload, entry.policy_version
        )
        self._set_latest(entry.seq)
        state.bump_queue()
        self._count(entry.env_id, "received")
        return {"status": "received"}

    def _buffer(self, env_index: int, entry: Entry, payload: bytes) -> dict[str, Any]:
        state = self.state
        buffer = state.buffers.setdefault(env_index, OrderedDict())
        buffer[entry.seq] = entry
        state.journal.insert_item(
            entry.seq, None, "buffered", env_index, entry.size, entry.t, payload, entry.policy_version
        )
        target = state.envs[env_index].group_size
        waiting = list(buffer.values())
        picked = subset_indices_summing_to([e.size for e in waiting], target)
        self._move_to_queue(env_index, [waiting[i] for i in picked])
        self._enforce_buffer_cap(env_index, target)
        self._count(env_index, "buffered")
        return {"status": "buffered", "buffer_size": state.buffered_sequences(env_index)}

    def _move_to_queue(self, env_index: int, entries: list[Entry]) -> None:
        state = self.state
        buffer = state.buffers[env_index]
        moves = []
        for entry in entries:
            del buffer[entry.seq]
            moves.append((entry.seq, state.queue.append(entry)))
            state.pending.add(entry)
        if moves:
            state.journal.move_items(moves, "queued")
            self._set_latest(entries[-1].seq)
            state.bump_queue()

    def _enforce_buffer_cap(self, env_index: int, target: int) -> None:
        cap = self.state.settings.max_buffered_sequences or 16 * target
        buffer = self.state.buffers[env_index]
        overflow: list[Entry] = []
        held = sum(e.size for e in buffer.values())
        for entry in buffer.values():
            if held <= cap:
                break
            overflow.append(entry)
            held -= entry.size
        self._flush(env_index, overflow, "size cap")

    def flush_stale_buffers(self) -> None:
        """Queue, as they are, buffered groups older than `--buffer-ttl`."""
        state = self.state
        cutoff = state.clock() - state.settings.buffer_ttl
        for env_index, buffer in state.buffers.items():
            stale = [e for e in buffer.values() if e.t < cutoff]
            if stale:
                with state.journal.transaction():
                    self._flush(env_index, stale, "age")

    def _flush(self, env_index: int, entries: list[Entry], reason: str) -> None:
        if not entries:
            return
        self._move_to_queue(env_index, entries)
        name = self.state.envs[env_index].real_name
        self.state.metrics.buffer_flushed.labels(env=name).inc(len(entries))
        log.info("queued %d buffered group(s) of env %s as they were (%s)", len(entries), name, reason)

    def _set_latest(self, seq: int) -> None:
        self.state.latest_seq = seq
        self.state.journal.set_meta("latest_seq", seq)

    def repeat_answer(self, key: Optional[str]) -> Optional[dict[str, Any]]:
        """The original answer, marked ``duplicate``, if submission `key` was seen."""
        if key is None or key not in self.state.responses:
            return None
        return {**orjson.loads(self.state.responses[key][1]), "duplicate": True}

    def remember(self, key: str, response: dict[str, Any]) -> None:
        """Answer later repeats of submission `key` with `response`."""
        state = self.state
        now = state.clock()
        encoded = orjson.dumps(response)
        state.responses[key] = (now, encoded)
        state.journal.remember_response(key, now, encoded)
        if len(state.responses) > MAX_REMEMBERED_SUBMISSIONS:
            oldest, _ = state.responses.popitem(last=False)
            state.journal.forget_responses([oldest])

    def forget_old_submission_ids(self) -> None:
        state = self.state
        cutoff = state.clock() - state.settings.idempotency_ttl
        expired = []
        for key, (t, _) in state.responses.items():
            if t >= cutoff:
                break
            expired.append(key)
        if expired:
            with state.journal.transaction():
                for key in expired:
                    del state.responses[key]
                state.journal.forget_responses(expired)

    def _count(self, env_id: Optional[int], status: str) -> None:
        self.state.metrics.submissions.labels(env=self.state.env_label(env_id), status=status).inc()
