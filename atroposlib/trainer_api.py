"""A consumer's side of the trajectory API: wait for it and take batches (trainers and tools).

A batch is taken with a *lease* (``POST /batch``): the API keeps it until the consumer
acknowledges it (``ack``: the API step advances) or gives it back (``nack``), and serves it
again if the lease runs out. A trainer acks a batch only after the optimizer step that used
it, so a crash mid-step loses nothing. Servers without leases (404/405 on ``POST /batch``)
are read with the legacy ``GET /batch``, which commits on delivery.

`BatchFeed` leases batches on a background thread so the next one is ready when a step
ends, holding at most ``max_prefetch_batches`` unacknowledged batches (the one in use
included). Every request carries ``Authorization: Bearer $ATROPOS_API_KEY`` when that
variable is set. Transient failures (connection errors, time-outs, 429 and 5xx answers)
are retried with exponential waits (`RETRY`); other errors raise `AtroposApiError` at once.
A feed also rides out an API that stops answering for a while (``run-api`` restarted: its
state, leases included, comes back from disk), waiting up to ``outage_seconds`` and saying so.
Closing a feed ends the lease it is waiting on at once (`InterruptibleSession`) rather than
when the API's long poll runs out.
"""

from __future__ import annotations

import collections
import os
import socket
import threading
import time
import weakref
from contextlib import suppress
from dataclasses import dataclass
from typing import Any, Callable, Optional, TypeVar

import requests
import tenacity
import urllib3

T = TypeVar("T")
API_KEY_ENV = "ATROPOS_API_KEY"
REQUEST_TIMEOUT_S = 10.0
LONG_POLL_S = 5.0  # how long the API may hold an empty POST /batch
PROGRESS_EVERY_S = 30.0
API_OUTAGE_S = 600.0  # how long a feed waits for an API that stopped answering (a restart) before giving up


class AtroposApiError(RuntimeError):
    """The trajectory API refused a request or could not be reached (one readable line);
    `status` is the HTTP status of a refusal."""

    def __init__(self, message: str, status: Optional[int] = None) -> None:
        super().__init__(message)
        self.status = status


@dataclass
class RetryPolicy:
    """How transient failures are retried: `attempts` tries, waits doubling from `min_wait` to `max_wait` s."""

    attempts: int = 5
    min_wait: float = 2.0
    max_wait: float = 30.0


RETRY = RetryPolicy()  # tests make the waits short by replacing it


@dataclass
class LeasedBatch:
    """One batch of groups (the API's 14-key items); `batch_id` is None when it came from
    the legacy ``GET /batch`` (already committed, nothing to acknowledge)."""

    batch_id: Optional[str]
    items: list[dict[str, Any]]
    step: Optional[int] = None


def auth_headers() -> dict[str, str]:
    """The bearer-token header when ``ATROPOS_API_KEY`` is set (read at each call)."""
    key = os.environ.get(API_KEY_ENV)
    return {"Authorization": f"Bearer {key}"} if key else {}


def _is_transient(error: BaseException) -> bool:
    if isinstance(error, (requests.ConnectionError, requests.Timeout)):
        return True
    if isinstance(error, requests.HTTPError) and error.response is not None:
        return error.response.status_code == 429 or error.response.status_code >= 500
    return False


def with_retries(call: Callable[[], T]) -> T:
    """`call()`, retried per `RETRY` on transient errors; the last error is raised as `AtroposApiError`."""
    retrying = tenacity.Retrying(
        stop=tenacity.stop_after_attempt(RETRY.attempts),
        wait=tenacity.wait_exponential(multiplier=RETRY.min_wait / 2, min=RETRY.min_wait, max=RETRY.max_wait),
        retry=tenacity.retry_if_exception(_is_transient),
        reraise=True,
    )
    try:
        return retrying(call)
    except requests.HTTPError as err:
        raise AtroposApiError(_describe_http_error(err), err.response.status_code) from None
    except requests.RequestException as err:
        raise AtroposApiError(f"the trajectory API did not answer: {err}") from None


def _describe_http_error(err: requests.HTTPError) -> str:
    response = err.response
    request = response.request
    hint = f": set {API_KEY_ENV} to the API's key" if response.status_code == 401 else ""
    return f"{request.method} {request.url} answered {response.status_code} {response.text[:300]}{hint}"


def request(method: str, url: str, *, json: Optional[dict[str, Any]] = None, timeout: float = REQUEST_TIMEOUT_S,
            session: Optional[requests.Session] = None) -> requests.Response:
    """One HTTP request with the auth header (on `session`'s connections, if given); HTTP error
    statuses raise `requests.HTTPError`."""
    send = requests.request if session is None else session.request
    response = send(method, url, json=json, headers=auth_headers(), timeout=timeout)
    response.raise_for_status()
    return response


class InterruptibleSession(requests.Session):
    """A session whose requests `interrupt` ends, from any thread.

    Each plain-HTTP connection it opens is remembered; `interrupt` half-closes them (no more
    writes, and so for good every one opened after): a server waiting to answer sees its client
    gone and stops, while an answer already on its way is still read. Connections over TLS or
    through a proxy are not interrupted: their requests end when the server answers."""

    def __init__(self) -> None:
        super().__init__()
        self._lock = threading.Lock()
        self._sockets: weakref.WeakSet[socket.socket] = weakref.WeakSet()
        self.interrupted = False
        opened = self._opened

        class Connection(urllib3.connection.HTTPConnection):
            def connect(self) -> None:
                super().connect()
                opened(self.sock)

        class Pool(urllib3.HTTPConnectionPool):
            ConnectionCls = Connection

        adapter = requests.adapters.HTTPAdapter()
        adapter.poolmanager.pool_classes_by_scheme = {**adapter.poolmanager.pool_classes_by_scheme, "http": Pool}
        self.mount("http://", adapter)

    def _opened(self, sock: socket.socket) -> None:
        with self._lock:
            self._sockets.add(sock)
            if self.interrupted:
                _stop_writing(sock)

    def interrupt(self) -> None:
        with self._lock:
            self.interrupted = True
            for sock in list(self._sockets):
                _stop_writing(sock)


def _stop_writing(sock: socket.socket) -> None:
    with suppress(OSError):  # already closed
        sock.shutdown(socket.SHUT_WR)


def check_atropos_api(url: str = "http://localhost:8000", timeout: float = 30.0) -> bool:
    """Whether ``GET {url}/info`` answers 200 within `timeout` seconds (polled every second)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            if requests.get(f"{url}/info", headers=auth_headers(), timeout=2).status_code == 200:
                return True
        except requests.RequestException:
            pass
        if time.monotonic() >= deadline:
            return False
        time.sleep(1.0)


def get_batch(url: str = "http://localhost:8000") -> dict[str, Any]:
    """One legacy ``GET /batch`` answer: ``{"batch": [...]}`` or ``{"batch": None}`` when none is ready."""
    answer = with_retries(lambda: request("GET", f"{url}/batch").json())
    if answer.get("status") == "error":
        raise AtroposApiError(f"GET {url}/batch: {answer.get('message', answer)}")
    return answer


class BatchFeed:
    """Batches from the API, leased ahead on a background thread (see the module docstring).

    ``with BatchFeed(url) as feed: batch = feed.next(); ...train...; feed.ack(batch)``."""

    def __init__(self, url: str, max_prefetch_batches: int = 4, lease_seconds: float = 1800.0, *,
                 wait_seconds: float = LONG_POLL_S, poll_interval: float = 1.0,
                 progress_every: float = PROGRESS_EVERY_S, outage_seconds: float = API_OUTAGE_S,
                 trains: bool = True, log: Callable[[str], None] = lambda line: print(line, flush=True)) -> None:
        if max_prefetch_batches < 1:
            raise ValueError("max_prefetch_batches must be at least 1")
        self.url = url.rstrip("/")
        self.lease_seconds = lease_seconds
        self.wait_seconds = wait_seconds
        self.poll_interval = poll_interval
        self.progress_every = progress_every
        self.outage_seconds = outage_seconds
        self.trains = trains  # False for a consumer that does not train: its acks leave the step alone
        self.log = log
        self.legacy = False
        self._slots = threading.Semaphore(max_prefetch_batches)  # one per unacknowledged batch
        self._ready: collections.deque[LeasedBatch] = collections.deque()
        self._handed_out: dict[int, LeasedBatch] = {}  # by id(): given to the trainer, not yet settled
        self._cond = threading.Condition()
        self._error: Optional[BaseException] = None
        self._stop = threading.Event()
        self._leasing = InterruptibleSession()  # the long polls of the background thread
        self._thread = threading.Thread(target=self._prefetch, name="atropos-batch-feed", daemon=True)
        self._thread.start()

    def __enter__(self) -> "BatchFeed":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- consumer side ------------------------------------------------------------------
    def next(self, timeout: Optional[float] = None) -> LeasedBatch:
        """The next batch, waiting for one (`TimeoutError` after `timeout` s, if given)."""
        started = time.monotonic()
        last_progress = started
        with self._cond:
            while not self._ready:
                if self._error is not None:
                    raise self._error
                if self._stop.is_set():
                    raise AtroposApiError("the batch feed is closed")
                now = time.monotonic()
                if timeout is not None and now - started >= timeout:
                    raise TimeoutError(f"no batch from {self.url} within {timeout:g} s")
                if now - last_progress >= self.progress_every:
                    self.log(f"waiting for batches from the environments ({now - started:.0f} s so far)")
                    last_progress = now
                self._cond.wait(0.5)
            batch = self._ready.popleft()
            self._handed_out[id(batch)] = batch
            return batch

    def ack(self, batch: LeasedBatch) -> int:
        """Commit `batch` (after its optimizer step); returns the API's step."""
        try:
            if batch.batch_id is None:  # legacy batches were committed when served
                return int(with_retries(lambda: request("GET", f"{self.url}/status").json())["current_step"])
            answer = self._settle(batch, "ack")
            return int(answer["current_step"])
        finally:
            self._release(batch)

    def nack(self, batch: LeasedBatch) -> None:
        """Give `batch` back: a leased batch returns to the head of the API's queue; a legacy
        batch (the API has forgotten it) to the head of this feed's queue."""
        if batch.batch_id is None:
            with self._cond:  # it keeps its slot
                if self._handed_out.pop(id(batch), None) is not None:
                    self._ready.appendleft(batch)
                    self._cond.notify_all()
            return
        try:
            self._settle(batch, "nack")
        finally:
            self._release(batch)

    def close(self) -> None:
        """Stop prefetching (ending the lease request in flight) and give back every leased
        batch not yet acknowledged."""
        self._stop.set()
        with self._cond:
            self._cond.notify_all()
        self._leasing.interrupt()
        self._thread.join()
        self._leasing.close()
        with self._cond:
            unsettled = [b for b in [*self._ready, *self._handed_out.values()] if b.batch_id is not None]
            dropped = sum(b.batch_id is None for b in self._ready)
            self._ready.clear()
            self._handed_out.clear()
        for batch in unsettled:
            try:
                request("POST", f"{self.url}/batch/{batch.batch_id}/nack")
            except requests.RequestException as err:
                self.log(f"could not give back batch {batch.batch_id} ({err}); it returns when its lease expires")
        if dropped:
            self.log(f"{dropped} prefetched legacy batch(es) dropped: GET /batch had already committed them")

    def _settle(self, batch: LeasedBatch, verb: str) -> dict[str, Any]:
        try:
            return self._through_outages(
                lambda: request("POST", f"{self.url}/batch/{batch.batch_id}/{verb}").json(), f"{verb} {batch.batch_id}")
        except AtroposApiError as err:
            if err.status == 410:
                raise AtroposApiError(
                    f"batch {batch.batch_id} was served again in another batch before its {verb} (its lease of "
                    f"{self.lease_seconds:g} s ran out, or the API restarted and another consumer took it): raise "
                    "--lease-seconds above the longest step", 410) from None
            raise

    def _through_outages(self, call: Callable[[], T], doing: str) -> T:
        """`with_retries(call)`, tried again while the API does not answer (or answers 5xx) for
        up to ``outage_seconds``, with a line every ``progress_every`` s; then the error."""
        started = time.monotonic()
        last_said: Optional[float] = None
        while True:
            try:
                return with_retries(call)
            except AtroposApiError as err:
                waited = time.monotonic() - started
                if (err.status is not None and err.status < 500) or self._stop.is_set():
                    raise
                if waited >= self.outage_seconds:
                    raise AtroposApiError(f"the trajectory API at {self.url} did not come back within "
                                          f"{self.outage_seconds:g} s ({doing}): {err}", err.status) from None
                if last_said is None or time.monotonic() - last_said >= self.progress_every:
                    self.log(f"the trajectory API at {self.url} does not answer ({doing}): waiting for it "
                             f"({waited:.0f} s so far, up to {self.outage_seconds:g} s)")
                    last_said = time.monotonic()
                self._stop.wait(self.poll_interval)

    def _release(self, batch: LeasedBatch) -> None:
        with self._cond:
            if self._handed_out.pop(id(batch), None) is None:
                return  # settled twice: its slot is already free
        self._slots.release()

    # -- background thread --------------------------------------------------------------
    def _prefetch(self) -> None:
        try:
            while not self._stop.is_set():
                if not self._slots.acquire(timeout=0.2):
                    continue
                batch = self._fetch_one()
                if batch is None:  # closed while waiting
                    return
                with self._cond:
                    self._ready.append(batch)
                    self._cond.notify_all()
        except BaseException as err:  # handed to the consumer: next() raises it
            with self._cond:
                self._error = err
                self._cond.notify_all()

    def _fetch_one(self) -> Optional[LeasedBatch]:
        """The next batch from the API, polling until one exists; None once closed."""
        while not self._stop.is_set():
            batch = self._get_legacy() if self.legacy else self._lease()
            if batch is not None:  # even when closed meanwhile: close() gives it back
                return batch
            self._stop.wait(self.poll_interval)
        return None

    def _lease(self) -> Optional[LeasedBatch]:
        body: dict[str, Any] = {"lease_seconds": self.lease_seconds, "wait_seconds": self.wait_seconds}
        if not self.trains:
            body["trains"] = False

        def call() -> Optional[dict[str, Any]]:
            try:
                timeout = REQUEST_TIMEOUT_S + self.wait_seconds
                return request("POST", f"{self.url}/batch", json=body, timeout=timeout, session=self._leasing).json()
            except requests.HTTPError as err:
                if err.response is not None and err.response.status_code in (404, 405):
                    return None
                raise
            except requests.ConnectionError:
                if self._leasing.interrupted:  # close() ended the wait: no batch was leased
                    return {"batch": None}
                raise

        answer = self._through_outages(call, "lease a batch")
        if answer is None:
            self.legacy = True
            self.log(f"{self.url} has no leased POST /batch: reading batches with GET /batch "
                     "(a batch lost in a crash is not served again)")
            return self._get_legacy()
        if answer.get("batch") is None:
            return None
        return LeasedBatch(batch_id=answer["batch_id"], items=answer["batch"], step=answer.get("step"))

    def _get_legacy(self) -> Optional[LeasedBatch]:
        answer = get_batch(self.url)
        return None if answer.get("batch") is None else LeasedBatch(batch_id=None, items=answer["batch"])
