"""The run: the trainer's registration, the environments, the step and the stored groups.

`RunState` is the single owner of the server's state. Every change happens in one
journal transaction, committed before the request that caused it is answered, and
handlers never await between reading and changing it, so concurrent requests see a
serial order. Submissions live in `intake`, batch hand-out in `dispatch`.

The *training step* is the step the next batch formed will be trained at: the current
step plus the leased batches not yet settled, since a trainer that prefetches several
leased batches trains them in order. The run's ``max_staleness`` bounds the staleness
(`atroposlib.policy_version`) of the groups served at that step.
"""

from __future__ import annotations

import logging
import secrets
import time
from collections import Counter, OrderedDict
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import orjson

from atroposlib.api.errors import ApiError, not_registered
from atroposlib.api.journal import Journal
from atroposlib.api.metrics import ApiMetrics
from atroposlib.api.queue import Entry, GroupQueue, PendingStats
from atroposlib.api.settings import ApiSettings
from atroposlib.api.status_math import status_for_env
from atroposlib.wire import EnvRecord, RegisterEnv, Registration, RunConfig

log = logging.getLogger("atroposlib.api")


@dataclass
class Lease:
    """A batch handed out by ``POST /batch`` and not yet settled."""

    batch_id: str
    seqs: list[int]
    expires_at: float
    step: int
    client_id: Optional[str] = None
    state: str = "leased"  # leased | acked | nacked | expired
    settled_at: Optional[float] = None
    entries: list[Entry] = field(default_factory=list, repr=False)
    trains: bool = True  # False: a dataset tool's lease, whose ack leaves the training step where it is

    def record(self) -> bytes:
        return orjson.dumps(
            {k: getattr(self, k) for k in ("batch_id", "seqs", "expires_at", "step",
                                           "client_id", "state", "settled_at", "trains")}
        )


class RunState:
    """All state of one trajectory API server, durable through its `Journal`."""

    def __init__(
        self,
        settings: ApiSettings,
        journal: Journal,
        metrics: ApiMetrics,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.settings = settings
        self.journal = journal
        self.metrics = metrics
        self.clock = clock
        self.started_at = clock()
        self.restored = False
        self._reset_memory()
        self._restore()

    # -- lifecycle ------------------------------------------------------------------
    def _reset_memory(self) -> None:
        self.config: Optional[RunConfig] = None
        self.started = False
        self.step = 0
        self.requesters: list[int] = []
        self.envs: list[EnvRecord] = []
        self.timed_out: set[int] = set()
        self.queue = GroupQueue()
        self.pending = PendingStats()
        self.buffers: dict[int, OrderedDict[int, Entry]] = {}
        self.leases: dict[str, Lease] = {}
        self.latest_seq: Optional[int] = None
        self.next_seq = 1
        self.batch_counter = 0
        self.responses: OrderedDict[str, tuple[float, bytes]] = OrderedDict()
        self.dead_letters: dict[str, int] = {}
        # Groups dropped unserved, by reason; read back from the journal on restart.
        self.dropped: Counter[str] = Counter()
        # (when, groups, newest policy version dropped, training step) of the last stale drop
        self.last_stale_drop: Optional[tuple[float, int, int, int]] = None
        self.unknown_version_groups = 0
        self.queue_version = 0

    def _restore(self) -> None:
        meta = self.journal.load_meta()
        if meta.get("config"):
            self.config = RunConfig.model_validate(meta["config"])
        self.started = bool(meta.get("started", False))
        self.step = int(meta.get("step", 0))
        self.latest_seq = meta.get("latest_seq")
        self.batch_counter = int(meta.get("batch_counter", 0))
        self.unknown_version_groups = int(meta.get("unknown_version_groups", 0))
        self.next_seq = self.journal.max_seq() + 1
        now = self.clock()
        for raw in self.journal.load_envs():
            record = EnvRecord.model_validate_json(raw)
            record.last_update = now  # restart grace: nobody could reach us while down
            self.envs.append(record)
        self.dead_letters = dict(self.journal.dead_letters())
        self.dropped = Counter(dict(self.journal.dropped_counts()))
        for key, t, response in self.journal.load_responses():
            self.responses[key] = (t, response)
        self._restore_items()
        self.restored = bool(meta) or len(self.queue) > 0 or bool(self.envs)

    def _restore_items(self) -> None:
        """Read back unserved groups and leases. A lease still within its time holds its groups
        again, so that the consumer that took it (a trainer riding out this restart) can ack
        it; the groups of any other lease go back to the head of the queue."""
        leased: dict[str, dict[int, Entry]] = {}
        for seq, pos, state, env_id, size, t, batch, expirations, version in self.journal.live_items():
            entry = Entry(seq, size, env_id, t, expirations, version)
            if state == "buffered":
                self.buffers.setdefault(env_id, OrderedDict())[seq] = entry
            elif state == "queued":
                self.queue.restore(entry, pos)
                self.pending.add(entry)
            else:
                leased.setdefault(batch or "", {})[seq] = entry
        now = self.clock()
        with self.journal.transaction():
            for raw in self.journal.load_leases():
                lease = Lease(**orjson.loads(raw))
                held = leased.get(lease.batch_id, {})
                if lease.state == "leased" and lease.expires_at > now and set(lease.seqs) <= held.keys():
                    lease.entries = [held.pop(seq) for seq in lease.seqs]
                    for entry in lease.entries:
                        self.pending.add(entry)
                elif lease.state == "leased":
                    lease.state, lease.settled_at = "expired", now
                    self.journal.save_lease(lease.batch_id, lease.record())
                self.leases[lease.batch_id] = lease
            interrupted = [entry for entries in leased.values() for entry in entries.values()]
            if interrupted:
                positions = self.queue.push_front(interrupted)
                for entry in interrupted:
                    self.pending.add(entry)
                self.journal.move_items(zip([e.seq for e in interrupted], positions), "queued")

    def save_meta(self) -> None:
        j = self.journal
        j.set_meta("config", self.config.model_dump() if self.config else None)
        j.set_meta("started", self.started)
        j.set_meta("step", self.step)
        j.set_meta("batch_counter", self.batch_counter)

    def reset(self) -> None:
        """Forget the whole run: registration, envs, every stored group and lease."""
        with self.journal.transaction():
            self.journal.wipe()
        self._reset_memory()
        self.restored = False

    @property
    def registered(self) -> bool:
        return self.config is not None

    @property
    def batch_size(self) -> int:
        return self.config.batch_size if self.config else -1

    @property
    def max_staleness(self) -> Optional[int]:
        return self.config.max_staleness if self.config else None

    def training_step(self) -> int:
        """The step the next batch formed will be trained at (tools' leases are not trained)."""
        return self.step + sum(lease.state == "leased" and lease.trains for lease in self.leases.values())

    def bump_queue(self) -> None:
        self.queue_version += 1

    # -- trainer registration ---------------------------------------------------------
    def register(self, registration: Registration) -> dict[str, Any]:
        incoming = RunConfig.from_registration(registration)
        outcome: dict[str, Any] = {}
        with self.journal.transaction():
            if self.config is None or registration.replace:
                outcome["registered"] = "replaced" if self.config else "new"
                self.config = incoming
                self.step = incoming.starting_step
                if outcome["registered"] == "new":
                    self.started = False
                self.save_meta()
            else:
                outcome["registered"] = "restored" if self.restored else "existing"
                differences = self.config.differences(incoming)
                if differences:
                    outcome["config_mismatch"] = list(differences)
                    outcome["config_mismatch_values"] = differences
        requester = secrets.randbits(128)
        self.requesters.append(requester)
        # the run's step, so that a trainer starting elsewhere learns it from this answer
        return {"uuid": requester, "uuid_str": str(requester), "current_step": self.step, **outcome}

    def mark_started(self) -> None:
        if not self.started:
            with self.journal.transaction():
                self.started = True
                self.journal.set_meta("started", True)

    # -- environments -------------------------------------------------------------------
    def register_env(self, request: RegisterEnv) -> dict[str, Any]:
        if not self.started and not self.settings.no_registration_gate:
            return {"status": "wait for trainer to start"}
        now = self.clock()
        weight = 1.0 if request.weight is None else request.weight
        record = self._reusable_record(request.env_key)
        fields = dict(
            max_context_len=request.max_token_length,
            weight=weight,
            group_size=request.group_size,
            min_batch_allocation=request.min_batch_allocation,
            connected=True,
            last_update=now,
        )
        with self.journal.transaction():
            if record is None:
                same_name = sum(e.desired_name == request.desired_name for e in self.envs)
                record = EnvRecord(
                    registered_id=len(self.envs),
                    desired_name=request.desired_name,
                    real_name=f"{request.desired_name}_{same_name}",
                    env_key=request.env_key,
                    **fields,
                )
                self.envs.append(record)
            else:
                for name, value in fields.items():
                    setattr(record, name, value)
                self.timed_out.discard(record.registered_id)
            self.journal.save_env(record.registered_id, record.model_dump_json().encode())
        config = self.config
        response: dict[str, Any] = {
            "status": "success",
            "env_id": record.registered_id,
            "wandb_name": record.real_name,
            "checkpoint_dir": config.checkpoint_dir if config else None,
            "starting_step": self.step,
            "checkpoint_interval": config.save_checkpoint_interval if config else None,
            "num_steps": config.num_steps if config else None,
        }
        warnings = self._packing_warnings(record.group_size)
        if warnings:
            response["warnings"] = warnings
        return response

    def _reusable_record(self, env_key: Optional[str]) -> Optional[EnvRecord]:
        if env_key is None:
            return None
        for record in self.envs:
            if record.env_key == env_key and not record.connected:
                return record
        return None

    def _packing_warnings(self, group_size: int) -> list[str]:
        batch_size = self.batch_size
        if batch_size <= 0:
            return []
        warnings = []
        if batch_size % group_size:
            warnings.append(
                f"batch_size {batch_size} is not a multiple of this env's group_size "
                f"{group_size}: batches may need the fallback packer"
            )
        largest = self.pending.sizes.largest()
        if largest and largest != group_size and batch_size % largest:
            warnings.append(
                f"batch_size {batch_size} is not a multiple of the largest queued group "
                f"size {largest}"
            )
        return warnings

    def env_index(self, env_id: Optional[int]) -> Optional[int]:
        """`env_id` if it names a registered env, else None."""
        if env_id is not None and 0 <= env_id < len(self.envs):
            return env_id
        return None

    def env_label(self, env_id: Optional[int]) -> str:
        """The metrics label of an env: its real name, or ``none`` for env-less data."""
        index = self.env_index(env_id)
        if index is not None:
            return self.envs[index].real_name
        return "none" if env_id is None else str(env_id)

    def disconnect_env(self, env_id: int) -> dict[str, Any]:
        if self.env_index(env_id) is None:
            return {
                "status": "failure",
                "error": f"env_id {env_id} is not registered ({len(self.envs)} envs known)",
            }
        record = self.envs[env_id]
        with self.journal.transaction():
            record.connected = False
            self.timed_out.discard(env_id)
            self.journal.save_env(env_id, record.model_dump_json().encode())
        return {"status": "success"}

    def touch_env(self, env_id: Optional[int]) -> None:
        """A liveness signal from `env_id`; revives an env that had timed out."""
        index = self.env_index(env_id)
        if index is None:
            return
        record = self.envs[index]
        record.last_update = self.clock()
        if index in self.timed_out:
            self.timed_out.discard(index)
            record.connected = True
            with self.journal.transaction():
                self.journal.save_env(index, record.model_dump_json().encode())
            log.info("env %s is alive again", record.real_name)

    def expire_silent_envs(self) -> None:
        timeout = self.settings.env_timeout
        if timeout <= 0:
            return
        now = self.clock()
        for record in self.envs:
            if record.connected and now - record.last_update > timeout:
                record.connected = False
                self.timed_out.add(record.registered_id)
                with self.journal.transaction():
                    self.journal.save_env(record.registered_id, record.model_dump_json().encode())
                log.warning(
                    "env %s silent for %.0f s: marked disconnected",
                    record.real_name, now - record.last_update,
                )

    def status_env(self, env_id: int) -> dict[str, Any]:
        if not self.registered:
            raise not_registered()
        if self.env_index(env_id) is None:
            raise ApiError(404, "unknown_env", f"env_id {env_id} is not registered", {"env_id": env_id})
        self.touch_env(env_id)
        return status_for_env(
            self.envs, env_id, self.pending, max(self.batch_size, 0), self.step
        )

    # -- simple views -----------------------------------------------------------------
    def wandb_info(self) -> dict[str, Any]:
        config = self.config
        return {
            "group": config.wandb_group if config else None,
            "project": config.wandb_project if config else None,
        }

    def info(self) -> dict[str, int]:
        config = self.config
        return {
            "batch_size": config.batch_size if config else -1,
            "max_token_len": config.max_token_len if config else -1,
        }

    def buffered_sequences(self, env_id: Optional[int] = None) -> int:
        buffers = self.buffers.values() if env_id is None else [self.buffers.get(env_id, {})]
        return sum(e.size for buffer in buffers for e in buffer.values())

    def leased_groups(self) -> int:
        return sum(len(l.seqs) for l in self.leases.values() if l.state == "leased")

    def leased_batches(self) -> int:
        return sum(l.state == "leased" for l in self.leases.values())

    def status(self) -> dict[str, Any]:
        return {
            "current_step": self.step,
            "queue_size": len(self.pending.sizes),
            "queue_sequences": self.pending.sizes.total,
            "buffered_sequences": self.buffered_sequences(),
            "leased_batches": self.leased_batches(),
            "batches_served": self.batch_counter,
            "registered": self.registered,
            "max_staleness": self.max_staleness,
            "num_steps": self.config.num_steps if self.config else None,
            "dropped_groups": dict(self.dropped),
            "unknown_version_groups": self.unknown_version_groups,
        }
