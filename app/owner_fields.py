"""Run owner-side fields on this node: each key's function in a worker thread, bounded, its failure its own.

The routing core (``ClusterStoreQueries.call_many``) sends each key to a node serving its partition: this
node's keys come here directly, a peer's in ONE ``_call`` sub-request (``schema.wire``) that its
``LocalPartitions.call`` answers here. Per batch:

1. the keys are grouped by partitions; a partition not hosted or not queryable fails its keys
   (STORE_MIGRATED / STORE_NOT_READY: the caller tries another replica), else its position and lag are
   read before the data, as for a lookup;
2. the functions run in the node's worker threads (never on the event loop): the batch's keys are claimed
   one at a time by up to ``workers`` threads, so one slow key delays no other;
3. a key whose function runs longer than the field's ``timeout_s`` is answered TIMEOUT (Python cannot stop
   a thread: it runs on, its answer dropped, and another worker takes over the batch's remaining keys); the
   keys still waiting when no worker has taken one for ``queue_timeout_s`` (every worker stuck) are TIMEOUT;
4. a function that raises is INTERNAL for that key only — logged here with the field, the key and the
   traceback, never shown to the client — except a partition its views found not ready or moved, which
   keeps its code (STORE_NOT_READY / STORE_MIGRATED) so that the routing core asks another replica;
5. a value is made JSON-able (datetimes and dates as ISO text, decimals as text, rows and tuples as lists)
   so that it is the same whichever node ran it; the schema converts it to the declared type.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import decimal
import logging
import threading
import time
from collections import defaultdict
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from iqgraph.app.local_partitions import definition_of
from iqgraph.app.owner_views import StoreViews
from iqgraph.schema.errors import INTERNAL, TIMEOUT, ApiError, api_error
from iqgraph.schema.types import Answer, OwnerFieldInfo
from iqgraph.stores import Key, StoreError, StoreNotReadyError, UnknownStoreError

if TYPE_CHECKING:
    from iqgraph.app.local_partitions import LocalPartitions
    from iqgraph.streaming.definitions import App, StoreDefinition
    from iqgraph.streaming.owner_fields import OwnerField

log = logging.getLogger(__name__)

DEFAULT_WORKERS = 4
DEFAULT_QUEUE_TIMEOUT_S = 10.0
Call = tuple[Key, tuple[int, ...]]
_PENDING = object()


def owner_field_of(app: App, name: str) -> OwnerField:
    """Return the owner-side field called name; UnknownStoreError (UNKNOWN_STORE) naming the known ones."""
    for owner in app.fields:
        if owner.name == name:
            return owner
    known = ", ".join(f.name for f in app.fields) or "none"
    raise UnknownStoreError(f"no owner-side field named {name!r} (fields: {known})")


def owner_field_infos(app: App) -> list[OwnerFieldInfo]:
    """Return the owner-side fields the schema shows, keyed as the stores they route by."""
    infos = []
    for owner in app.fields:
        store = app.store(owner.store)
        key_type = store.resolved_key_type(app.topic(store.topic))
        infos.append(OwnerFieldInfo(owner.name, key_type, owner.value_type, owner.store, owner.description))
    return infos


def as_json(value: Any) -> Any:
    """Return a function's value as JSON-able data the schema's converters read; TypeError if it is none."""
    if value is None or isinstance(value, str | bool | int | float):
        return value
    if isinstance(value, dt.datetime | dt.date):
        return value.isoformat()
    if isinstance(value, decimal.Decimal):
        return str(value)
    if isinstance(value, bytes | bytearray):
        return bytes(value).decode("utf-8")
    as_dict = getattr(value, "asDict", None)  # a pyspark Row
    if callable(as_dict):
        return as_json(as_dict())
    if isinstance(value, Mapping):
        if all(isinstance(k, str) for k in value):
            return {k: as_json(v) for k, v in value.items()}
        return [[as_json(k), as_json(v)] for k, v in value.items()]
    if isinstance(value, list | tuple):
        return [as_json(v) for v in value]
    raise TypeError(f"returned a {type(value).__name__}, which is no value of a Spark type")


def _run(owner: OwnerField, key: Key, views: StoreViews) -> Any:
    """Return the function's JSON-able value for key, or the error to answer in its place (in a worker)."""
    try:
        return as_json(owner.function(key, views))
    except Exception as exc:  # noqa: BLE001 - the user's code: any failure is that key's, never the batch's
        if isinstance(exc, StoreNotReadyError | ApiError):  # a partition not ready, or moved: the caller
            return api_error(exc)  # tries another replica; any other failure is the function's own
        log.error("owner-side field %s failed for key %r", owner.name, key, exc_info=exc)
        return ApiError(
            f"Internal error in owner-side field {owner.name} for this key; the server has logged the details.",
            INTERNAL,
        )


@dataclass
class _Batch:
    """One batch's keys, claimed one at a time by worker threads; results guarded by the lock."""

    owner: OwnerField
    jobs: list[tuple[Key, StoreViews]]
    lock: threading.Lock = field(default_factory=threading.Lock)
    next: int = 0
    started: list[float | None] = field(init=False)
    results: list[Any] = field(init=False)
    last_claim: float = field(default_factory=time.monotonic)  # when a worker last took a key

    def __post_init__(self) -> None:
        self.started = [None] * len(self.jobs)
        self.results = [_PENDING] * len(self.jobs)

    def work(self) -> None:
        """Run unclaimed keys until none is left (in a worker thread)."""
        while True:
            with self.lock:
                i = self.next
                if i >= len(self.jobs):
                    return
                self.next += 1
                self.started[i] = self.last_claim = time.monotonic()
            value = _run(self.owner, *self.jobs[i])
            with self.lock:
                if self.results[i] is _PENDING:  # not timed out meanwhile
                    self.results[i] = value

    def expire(self, now: float, queue_timeout_s: float) -> tuple[list[int], float | None]:
        """Answer TIMEOUT for keys past their time; return them and the next deadline (None: no key runs).

        Keys still unclaimed when no worker has taken one for queue_timeout_s (every worker stuck) are TIMEOUT.
        """
        timeout = self.owner.timeout_s
        expired: list[int] = []
        deadlines: list[float] = []
        with self.lock:
            for i in range(self.next):
                began = self.started[i]
                if self.results[i] is not _PENDING or began is None:
                    continue
                if now - began >= timeout:
                    self.results[i] = self._timeout(f"ran longer than {timeout:g} s")
                    expired.append(i)
                else:
                    deadlines.append(began + timeout)
            if self.next < len(self.jobs):
                queue_deadline = self.last_claim + queue_timeout_s
                if now >= queue_deadline:
                    for i in range(self.next, len(self.jobs)):
                        self.results[i] = self._timeout("waited for a free worker (every one busy) too long")
                    self.next = len(self.jobs)
                else:
                    deadlines.append(queue_deadline)
        return expired, min(deadlines) if deadlines else None

    def _timeout(self, why: str) -> ApiError:
        owner = self.owner
        return ApiError(
            f"owner-side field {owner.name} {why}", TIMEOUT, field=owner.name, timeoutMs=int(owner.timeout_s * 1000)
        )

    @property
    def unclaimed(self) -> bool:
        """Return whether keys wait for a worker."""
        return self.next < len(self.jobs)


class OwnerFieldRunner:
    """Run owner-side fields on the partitions a LocalPartitions hosts, in a pool of worker threads."""

    def __init__(
        self,
        local: LocalPartitions,
        *,
        workers: int = DEFAULT_WORKERS,
        queue_timeout_s: float = DEFAULT_QUEUE_TIMEOUT_S,
    ) -> None:
        self.local = local
        self.workers = workers
        self.queue_timeout_s = queue_timeout_s
        self._pool = ThreadPoolExecutor(workers, thread_name_prefix="iqgraph-owner-field")

    async def call(self, field: str, calls: Sequence[Call]) -> Answer[list[Any]]:
        """Return field's value per (key, partitions), in call order (an exception in place of a failed key)."""
        app = self.local.app
        owner = owner_field_of(app, field)
        routing = definition_of(app, owner.store)
        groups: dict[tuple[int, ...], list[int]] = defaultdict(list)
        for i, (_, partitions) in enumerate(calls):
            groups[tuple(sorted(partitions))].append(i)
        answer: Answer[list[Any]] = Answer([None] * len(calls))
        runs: list[int] = []
        jobs: list[tuple[Key, StoreViews]] = []
        for partitions, indexes in groups.items():
            refused = self._read_marks(routing, partitions, answer)
            if refused is None:
                views = StoreViews(self.local, routing, partitions)
                runs += indexes
                jobs += [(calls[i][0], views) for i in indexes]
            else:
                for i in indexes:
                    answer.value[i] = refused
        for i, value in zip(runs, await self._run_batch(_Batch(owner, jobs)), strict=True):
            answer.value[i] = value
        return answer

    def _read_marks(self, routing: StoreDefinition, partitions: Sequence[int], answer: Answer[Any]) -> Exception | None:
        """Add the partitions' positions and lags to answer (read before the data); or return why they can't be read.

        The lookups' own checks (``LocalPartitions``): not hosted → STORE_MIGRATED, not queryable → STORE_NOT_READY.
        """
        stores, positions, lags = self.local._positions(routing, partitions)
        refused = next((e for e in stores.values() if isinstance(e, StoreError)), None)
        if refused is None:
            answer.positions.update(positions)
            answer.lags.update(lags)
        return refused

    async def _run_batch(self, batch: _Batch) -> list[Any]:
        """Return each key's value or error once every key is answered or timed out."""
        if not batch.jobs:
            return []
        loop = asyncio.get_running_loop()
        running = {loop.run_in_executor(self._pool, batch.work) for _ in range(min(self.workers, len(batch.jobs)))}
        while True:
            expired, deadline = batch.expire(time.monotonic(), self.queue_timeout_s)
            for i in expired:
                log.warning(
                    "owner-side field %s timed out for key %r after %g s (its thread runs on)",
                    batch.owner.name,
                    batch.jobs[i][0],
                    batch.owner.timeout_s,
                )
                if batch.unclaimed:  # the stuck worker's place: another takes the keys still waiting
                    running.add(loop.run_in_executor(self._pool, batch.work))
            running = {f for f in running if not f.done()}
            if deadline is None and not batch.unclaimed:
                break
            if not running:
                running.add(loop.run_in_executor(self._pool, batch.work))
            wait = None if deadline is None else max(deadline - time.monotonic(), 0.0)
            await asyncio.wait(running, timeout=wait, return_when=asyncio.FIRST_COMPLETED)
        with batch.lock:
            return list(batch.results)

    def close(self) -> None:
        """Stop the worker threads once their functions return (a stuck one is not waited for)."""
        self._pool.shutdown(wait=False, cancel_futures=True)
