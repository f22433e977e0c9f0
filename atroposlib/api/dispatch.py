"""Handing batches to trainers: formation, the legacy pop-on-read, leases and acks.

Batches are formed lazily, one per request, from the oldest data. The step counts
batches *committed* to a trainer: +1 per legacy ``GET /batch`` and per acknowledged
lease. A lease that is not acknowledged in time (or is nacked) puts its groups back at
the head of the queue in their original order; groups whose leases keep expiring are
dead-lettered after ``--max-redeliveries`` attempts instead of circling forever.

With the run's ``max_staleness`` set, each batch formation first drops the queued groups
whose staleness at the training step (`RunState.training_step`) exceeds it: they leave
the queue for the journal state ``dropped`` (reason ``stale``) instead of being served.
Groups of unknown policy version are always served.
"""

from __future__ import annotations

import logging
from collections import Counter
from typing import Any, Iterator, Optional

from atroposlib.api.errors import ApiError
from atroposlib.api.items import served_items
from atroposlib.api.packing import pick_exact, pick_fifo_subset, pick_with_minimums
from atroposlib.api.queue import Entry
from atroposlib.api.state import Lease, RunState
from atroposlib.policy_version import staleness

log = logging.getLogger("atroposlib.api")

STALE = "stale"


class Dispatcher:
    """Forms batches from a `RunState` and tracks their delivery."""

    def __init__(self, state: RunState) -> None:
        self.state = state
        self._unpackable_cache: tuple[int, int, Optional[str]] = (-1, -1, None)

    # -- formation ----------------------------------------------------------------------
    def _form(self) -> Optional[list[Entry]]:
        """Pick the groups of the next batch (not yet removed from the queue)."""
        state = self.state
        batch_size = state.batch_size
        queue = state.queue
        if batch_size <= 0 or queue.sizes.total < batch_size:
            return None
        has_minimums = any(e.min_batch_allocation is not None for e in state.envs)
        if has_minimums:
            entries = list(queue)
            picked = pick_with_minimums(
                [e.size for e in entries], [e.env_id for e in entries], batch_size,
                self._live_minimums(),
            )
        else:
            entries = []
            picked = pick_exact(
                _sizes_into(queue, entries), batch_size, queue.sizes.largest(), queue.sizes.total
            )
        if picked is None:
            return self._fallback(batch_size)
        return [entries[i] for i in picked]

    def _live_minimums(self) -> dict[int, float]:
        return {
            e.registered_id: e.min_batch_allocation
            for e in self.state.envs
            if e.connected and e.min_batch_allocation is not None
        }

    def _fallback(self, batch_size: int) -> Optional[list[Entry]]:
        """Oldest-first exact packing once the oldest group has waited out the grace."""
        state = self.state
        oldest = state.queue.oldest()
        if oldest is None or state.clock() - oldest.t < state.settings.starvation_grace:
            return None
        entries = list(state.queue)
        minimums = self._live_minimums()
        if minimums:
            honoured = _fallback_with_minimums(entries, batch_size, minimums)
            if honoured is not None:
                return honoured
        picked = pick_fifo_subset([e.size for e in entries], batch_size)
        if picked is None:
            return None
        if minimums:
            state.metrics.min_allocation_waived.inc()
        log.info("fallback packer formed a batch of %d groups", len(picked))
        return [entries[i] for i in picked]

    def _take_next_batch(self, trains: bool = True) -> Optional[tuple[list[Entry], str]]:
        """Form the next batch, remove its groups from the queue and name it; inside
        the caller's transaction. None when no batch can be formed. Groups too stale to
        train on are dropped first, unless the batch is for a consumer that does not train."""
        state = self.state
        if trains:
            self._drop_stale()
        entries = self._form()
        if entries is None:
            return None
        state.queue.take(e.seq for e in entries)
        state.bump_queue()
        state.metrics.batch_wait.observe(max(0.0, state.clock() - min(e.t for e in entries)))
        state.batch_counter += 1
        state.journal.set_meta("batch_counter", state.batch_counter)
        return entries, f"b-{state.batch_counter:06d}"

    def _drop_stale(self) -> None:
        """Drop every queued group staler than ``max_staleness`` at the training step;
        inside the caller's transaction. The groups left out of the next batch train no
        earlier than it, so a group too stale for it stays too stale."""
        state = self.state
        bound = state.max_staleness
        oldest = state.queue.oldest_version()
        if bound is None or oldest is None:
            return
        step = state.training_step()
        if step - oldest <= bound:
            return
        lags = {e.seq: step - e.policy_version for e in state.queue if e.policy_version is not None}
        stale = [e for e in state.queue if lags.get(e.seq, 0) > bound]
        state.queue.take(e.seq for e in stale)
        for entry in stale:
            state.pending.remove(entry)
        state.journal.drop_items((e.seq for e in stale), STALE, step)
        state.dropped[STALE] += len(stale)
        state.bump_queue()
        for env_id, count in Counter(e.env_id for e in stale).items():
            state.metrics.dropped_groups.labels(env=state.env_label(env_id), reason=STALE).inc(count)
        dropped_lags = [lags[e.seq] for e in stale]
        state.last_stale_drop = (state.clock(), len(stale), step - min(dropped_lags), step)
        log.warning(
            "dropped %d stale group(s): sampled %s steps before step %d, over max_staleness %d",
            len(stale), _span(min(dropped_lags), max(dropped_lags)), step, bound,
        )

    def unpackable_reason(self) -> Optional[str]:
        """Why queued groups can never form a batch, when that is so (cached per change)."""
        state = self.state
        version, batch_size, reason = self._unpackable_cache
        if version == state.queue_version and batch_size == state.batch_size:
            return reason
        reason = None
        if 0 < state.batch_size <= state.queue.sizes.total:
            sizes = [e.size for e in state.queue]
            if pick_fifo_subset(sizes, state.batch_size) is None:
                reason = (
                    f"batch_size {state.batch_size} is not reachable from group sizes "
                    f"{sorted(set(sizes))}"
                )
        self._unpackable_cache = (state.queue_version, state.batch_size, reason)
        return reason

    # -- legacy pop-on-read -------------------------------------------------------------------
    def pop_batch(self) -> Optional[list[bytes]]:
        """Form, commit and return one batch (``GET /batch``), or None."""
        state = self.state
        with state.journal.transaction():
            taken = self._take_next_batch()
            if taken is None:
                return None
            entries, batch_id = taken
            self._commit(entries, batch_id)
        state.metrics.batches_served.labels(mode="get").inc()
        return served_items(state.journal.item_payloads([e.seq for e in entries]))

    def _commit(self, entries: list[Entry], batch_id: str, trains: bool = True) -> None:
        """Mark `entries` served as `batch_id`; a batch a trainer trained on advances the step."""
        state = self.state
        trained_at = state.step
        state.step += 1 if trains else 0
        unknown = 0
        for entry in entries:
            state.pending.remove(entry)
            lag = staleness(trained_at, entry.policy_version)
            if lag is None:
                unknown += 1
            else:
                state.metrics.served_staleness.observe(lag)
        if unknown:
            state.unknown_version_groups += unknown
            state.metrics.served_unknown_version.inc(unknown)
            state.journal.set_meta("unknown_version_groups", state.unknown_version_groups)
        state.journal.move_items(
            ((e.seq, None) for e in entries), "served", batch_id, state.step, state.clock()
        )
        state.journal.set_meta("step", state.step)

    # -- leases -------------------------------------------------------------------------------
    def lease_batch(self, lease_seconds: float, client_id: Optional[str],
                    trains: bool = True) -> Optional[tuple[Lease, list[bytes]]]:
        state = self.state
        with state.journal.transaction():
            taken = self._take_next_batch(trains)
            if taken is None:
                return None
            entries, batch_id = taken
            lease = Lease(
                batch_id=batch_id,
                seqs=[e.seq for e in entries],
                expires_at=state.clock() + lease_seconds,
                step=state.step,
                client_id=client_id,
                entries=entries,
                trains=trains,
            )
            state.leases[lease.batch_id] = lease
            state.journal.move_items(((s, None) for s in lease.seqs), "leased", lease.batch_id)
            state.journal.save_lease(lease.batch_id, lease.record())
        state.metrics.batches_served.labels(mode="lease").inc()
        return lease, served_items(state.journal.item_payloads(lease.seqs))

    def _lease(self, batch_id: str) -> Lease:
        self.expire_leases()
        lease = self.state.leases.get(batch_id)
        if lease is None:
            raise ApiError(404, "lease_not_found", f"no batch {batch_id!r} was leased", {"batch_id": batch_id})
        return lease

    def ack(self, batch_id: str) -> dict[str, Any]:
        state = self.state
        lease = self._lease(batch_id)
        if lease.state == "acked":
            return {"status": "already_acked", "current_step": state.step}
        if lease.state == "expired" and lease.seqs and state.queue.holds(lease.seqs):
            # the lease ran out, or the server restarted, but no batch has taken its groups since:
            # the trainer did train on them, so the late ack stands
            with state.journal.transaction():
                entries = state.queue.take(lease.seqs)
                state.bump_queue()
                self._commit(entries, batch_id, lease.trains)
                self._settle(lease, "acked")
            return {"status": "acked", "current_step": state.step}
        if lease.state != "leased":
            raise ApiError(
                410, "lease_expired",
                f"batch {batch_id} was {lease.state} and its groups went back to the queue",
                {"batch_id": batch_id, "state": lease.state},
            )
        with state.journal.transaction():
            self._commit(lease.entries, batch_id, lease.trains)
            self._settle(lease, "acked")
        return {"status": "acked", "current_step": state.step}

    def nack(self, batch_id: str) -> dict[str, Any]:
        state = self.state
        lease = self._lease(batch_id)
        if lease.state == "acked":
            raise ApiError(409, "lease_settled", f"batch {batch_id} was already acknowledged")
        if lease.state != "leased":
            return {"status": lease.state, "current_step": state.step}
        with state.journal.transaction():
            self._requeue(lease.entries)
            self._settle(lease, "nacked")
        return {"status": "nacked", "current_step": state.step}

    def expire_leases(self) -> None:
        state = self.state
        now = state.clock()
        for lease in list(state.leases.values()):
            if lease.state != "leased" or lease.expires_at > now:
                continue
            limit = state.settings.max_redeliveries
            for entry in lease.entries:
                entry.expirations += 1
            dead = [e for e in lease.entries if e.expirations >= limit]
            alive = [e for e in lease.entries if e.expirations < limit]
            with state.journal.transaction():
                state.journal.count_expirations(lease.seqs)
                self._requeue(alive)
                for entry in dead:
                    state.pending.remove(entry)
                state.journal.move_items(((e.seq, None) for e in dead), "dead", lease.batch_id)
                if dead:
                    state.dead_letters[lease.batch_id] = len(dead)
                self._settle(lease, "expired")
            state.metrics.lease_expired.inc()
            log.warning(
                "lease %s expired: %d group(s) back in the queue, %d dead-lettered",
                lease.batch_id, len(alive), len(dead),
            )

    def _requeue(self, entries: list[Entry]) -> None:
        state = self.state
        positions = state.queue.push_front(entries)
        state.journal.move_items(zip((e.seq for e in entries), positions), "queued")
        state.bump_queue()

    def _settle(self, lease: Lease, outcome: str) -> None:
        lease.state = outcome
        lease.settled_at = self.state.clock()
        lease.entries = []
        self.state.journal.save_lease(lease.batch_id, lease.record())

    def forget_old_history(self) -> None:
        """Drop settled leases and served groups older than `--served-retention`."""
        state = self.state
        cutoff = state.clock() - state.settings.served_retention
        old = [
            l.batch_id for l in state.leases.values()
            if l.settled_at is not None and l.settled_at < cutoff
        ]
        with state.journal.transaction():
            for batch_id in old:
                del state.leases[batch_id]
                state.journal.drop_lease(batch_id)
            state.journal.forget_served_before(cutoff, state.latest_seq)


def _span(low: int, high: int) -> str:
    return str(low) if low == high else f"{low}-{high}"


def _sizes_into(entries: Any, seen: list[Entry]) -> Iterator[int]:
    """Yield sizes of `entries` in order, remembering each entry read in `seen`."""
    for entry in entries:
        seen.append(entry)
        yield entry.size


def _fallback_with_minimums(
    entries: list[Entry], batch_size: int, minimums: dict[int, float]
) -> Optional[list[Entry]]:
    """Give each env its minimum share from its oldest groups, then complete the batch
    with the oldest exact subset of the rest; None when that is infeasible."""
    chosen: set[int] = set()
    taken = 0
    for env_id, share in minimums.items():
        quota, env_taken = int(batch_size * share), 0
        for index, entry in enumerate(entries):
            if env_taken >= quota:
                break
            if entry.env_id == env_id:
                chosen.add(index)
                env_taken += entry.size
                taken += entry.size
    if taken > batch_size:
        return None
    rest = [i for i in range(len(entries)) if i not in chosen]
    if taken < batch_size:
        completion = pick_fifo_subset([entries[i].size for i in rest], batch_size - taken)
        if completion is None:
            return None
        chosen.update(rest[i] for i in completion)
    return [entries[i] for i in sorted(chosen)]
