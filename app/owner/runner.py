"""Run owner-side fields on this node: each key's function in a worker thread, bounded, its failure its own.

The routing core (``ClusterStoreQueries.call_many``) sends each key to a node serving its partition: this
node's keys come here directly, a peer's in ONE ``_call`` sub-request (``schema.wire``) that its
``LocalPartitions.call`` answers here. Per batch:

1. the keys are grouped by partitions; a partition not hosted or not queryable fails its keys
   (STORE_MIGRATED / STORE_NOT_READY: the caller tries another replica), else its position and lag are
   read before the data, as for a lookup, and whether the routing store holds each key in those partitions
   (``found``: with two candidate partitions, the caller keeps the answer of the one holding the key);
2. the functions run in the node's worker threads (daemon threads: never on the event loop, never holding
   the process at exit), one key a task, so one slow key delays no other;
3. a key is TIMEOUT when it waited for a free worker for its field's ``timeout_s``, ran longer than
   ``timeout_s``, or is unanswered ``OWNER_FIELD_MAX_TIMEOUT_S`` after the batch came (so that a peer answers
   before the caller's peer timeout). Python cannot stop a thread: one stuck past its key's timeout runs on,
   its answer dropped, and is *replaced*, so the workers keep their number; at most ``max_stuck`` threads are
   left so — beyond, every call answers TIMEOUT at once (logged) until some return;
4. a function that raises is INTERNAL for that key only — logged here with the field, the key and the
   traceback, never shown to the client — except a partition its views found not ready or moved, which
   keeps its code (STORE_NOT_READY / STORE_MIGRATED) so that the routing core asks another replica;
5. a value is made JSON (datetimes and dates as ISO text, decimals as text, bytes as base64, rows and tuples
   as lists) and checked HERE with the converter the schema reads it with (``schema.owner_fields``): a value
   not of the declared type — NaN and infinities included — is INTERNAL for that key, logged with the field,
   key and reason; so an answer is the same whichever node ran it.
"""

from __future__ import annotations

import asyncio
import base64
import datetime as dt
import decimal
import itertools
import logging
import queue
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from pyspark.sql.types import ArrayType, BinaryType, DataType, MapType, StructType

from iqgraph.app.catalog import definition_of
from iqgraph.app.owner.views import LocalStoreViews
from iqgraph.schema.access import ANONYMOUS, Principal
from iqgraph.schema.errors import INTERNAL, TIMEOUT, ApiError, api_error, fails_over
from iqgraph.schema.owner_fields import value_converter
from iqgraph.schema.types import Answer, OwnerFieldInfo
from iqgraph.schema.wire import Owned
from iqgraph.stores import Key, PartitionStores, StoreError, StoreNotReadyError, UnknownStoreError
from iqgraph.streaming.owner_fields import OWNER_FIELD_MAX_TIMEOUT_S
from iqgraph.streaming.types import StoreViews

if TYPE_CHECKING:
    from iqgraph.app.query.partitions import LocalPartitions
    from iqgraph.streaming.definitions import App, StoreDefinition
    from iqgraph.streaming.owner_fields import OwnerField

log = logging.getLogger(__name__)

DEFAULT_WORKERS = 4
#: Most worker threads left running a function past its key's timeout (each replaced) before calls are refused.
MAX_STUCK_THREADS = 32
Call = tuple[Key, tuple[int, ...]]


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


def as_json(value: Any, data_type: DataType) -> Any:
    """Return a function's value of data_type as the JSON the schema's converter reads; TypeError if it can't be.

    Bytes (``binary`` only) as base64 text, datetimes and dates as ISO text, decimals as text, a struct from a
    mapping, a pyspark Row or a tuple of its fields, a map with string keys as an object (else [key, value]
    pairs). The schema's converter then checks the rest (numbers, nulls, ranges).
    """
    if value is None:
        return None
    if isinstance(data_type, BinaryType):
        if isinstance(value, bytes | bytearray | memoryview):
            return base64.b64encode(value).decode("ascii")
        raise TypeError(f"returned a {type(value).__name__} for a binary value: return bytes")
    if isinstance(value, bytes | bytearray | memoryview):
        raise TypeError(f"returned bytes for a {data_type.simpleString()} value")
    if isinstance(data_type, StructType):
        return _struct(value, data_type)
    if isinstance(data_type, ArrayType):
        if not isinstance(value, list | tuple):
            raise TypeError(f"returned a {type(value).__name__} for an array: return a list")
        return [as_json(v, data_type.elementType) for v in value]
    if isinstance(data_type, MapType):
        if not isinstance(value, Mapping):
            raise TypeError(f"returned a {type(value).__name__} for a map: return a dict")
        pairs = [(as_json(k, data_type.keyType), as_json(v, data_type.valueType)) for k, v in value.items()]
        if all(isinstance(k, str) for k, _ in pairs):
            return dict(pairs)
        return [[k, v] for k, v in pairs]
    return _atom(value)


def _struct(value: Any, struct: StructType) -> Any:
    as_dict = getattr(value, "asDict", None)  # a pyspark Row
    if callable(as_dict):
        value = as_dict()
    if isinstance(value, Mapping):
        unknown = [k for k in value if k not in struct.fieldNames()]
        if unknown:
            raise TypeError(f"returned fields {unknown} that {struct.simpleString()} does not have")
        return {f.name: as_json(value.get(f.name), f.dataType) for f in struct.fields}
    if isinstance(value, list | tuple):
        if len(value) != len(struct.fields):
            raise TypeError(f"returned {len(value)} fields for {struct.simpleString()}")
        return [as_json(v, f.dataType) for v, f in zip(value, struct.fields, strict=True)]
    raise TypeError(f"returned a {type(value).__name__} for a struct: return a dict, a Row or a tuple")


def _atom(value: Any) -> Any:
    if isinstance(value, str | bool | int | float):
        return value
    if isinstance(value, dt.datetime | dt.date):
        return value.isoformat()
    if isinstance(value, decimal.Decimal):
        return str(value)
    raise TypeError(f"returned a {type(value).__name__}, which is no value of a Spark type")


class _Field:
    """An owner-side field as the runner runs it: the function, and the schema's check of its values."""

    def __init__(self, owner: OwnerField) -> None:
        self.owner = owner
        self.name = owner.name
        self.timeout_s = min(owner.timeout_s, OWNER_FIELD_MAX_TIMEOUT_S)
        self.check = value_converter(owner.name, owner.value_type)

    def run(self, key: Key, views: StoreViews, found: bool) -> Any:
        """Return Owned(found, value or the key's error), or a replica's error (in a worker)."""
        owner = self.owner
        try:
            value = owner.function(key, views)
        except Exception as exc:  # noqa: BLE001 - the user's code: any failure is that key's, never the batch's
            if isinstance(exc, StoreNotReadyError | ApiError):  # a partition not ready, or moved: the caller
                error = api_error(exc)  # tries another replica; any other failure is the function's own
                if fails_over(error):
                    return error
                if isinstance(error, ApiError):
                    return Owned(found, error)
            log.error("owner-side field %s failed for key %r", owner.name, key, exc_info=exc)
            return Owned(found, self.internal())
        try:
            encoded = as_json(value, owner.value_type)
            self.check(encoded)
        except (TypeError, ValueError, StoreError) as exc:  # ValueFormatError is a StoreError
            log.error(
                "owner-side field %s for key %r returned a value not of its type %s: %s",
                owner.name,
                key,
                owner.value_type.simpleString(),
                exc,
            )
            return Owned(found, self.internal())
        return Owned(found, encoded)

    def internal(self) -> ApiError:
        return ApiError(
            f"Internal error in owner-side field {self.name} for this key; the server has logged the details.",
            INTERNAL,
        )

    def timeout(self, why: str) -> ApiError:
        return ApiError(
            f"owner-side field {self.name} {why}", TIMEOUT, field=self.name, timeoutMs=int(self.timeout_s * 1000)
        )


_PENDING, _RUNNING, _DONE, _EXPIRED = range(4)


class _Task:
    """One key's run: claimed by a worker, finished by it or expired by the event loop (whichever is first)."""

    def __init__(self, run: Callable[[], Any], loop: asyncio.AbstractEventLoop) -> None:
        self._run = run
        self.loop = loop
        self.done: asyncio.Future[None] = loop.create_future()
        self.lock = threading.Lock()
        self.state = _PENDING
        self.thread: threading.Thread | None = None
        self.started = 0.0
        self.result: Any = None

    def run_in(self, thread: threading.Thread) -> None:
        """Run the key in thread unless it expired while it waited (in a worker)."""
        with self.lock:
            if self.state != _PENDING:
                return
            self.state, self.thread, self.started = _RUNNING, thread, time.monotonic()
        result = self._run()
        with self.lock:
            if self.state != _RUNNING:  # timed out meanwhile: its answer is dropped
                return
            self.state, self.result = _DONE, result
        try:
            self.loop.call_soon_threadsafe(_wake, self.done)
        except RuntimeError:  # the loop closed meanwhile: nobody waits
            pass

    def expire(self, result: Any) -> tuple[int, threading.Thread | None]:
        """Answer result in the key's place unless it finished; return the state it had and its thread."""
        with self.lock:
            state = self.state
            if state in (_PENDING, _RUNNING):
                self.state, self.result = _EXPIRED, result
            return state, self.thread


def _wake(done: asyncio.Future[None]) -> None:
    if not done.done():
        done.set_result(None)


class _Workers:
    """Daemon threads taking tasks from one queue; a thread stuck past its key's timeout is replaced."""

    def __init__(self, size: int, max_stuck: int) -> None:
        self.size = size
        self.max_stuck = max_stuck
        self._tasks: queue.SimpleQueue[_Task | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._live: set[threading.Thread] = set()
        self._stuck = 0
        self._closed = False
        self._names = itertools.count(1)

    @property
    def stuck(self) -> int:
        """Return how many threads run a function past its key's timeout (each replaced)."""
        return self._stuck

    @property
    def live(self) -> int:
        """Return how many threads take tasks."""
        return len(self._live)

    def submit(self, task: _Task) -> None:
        """Queue task for the next free worker."""
        self._grow()
        self._tasks.put(task)

    def abandon(self, thread: threading.Thread) -> None:
        """Leave thread to its stuck function (it ends when that returns) and start another in its place."""
        with self._lock:
            if thread not in self._live:
                return
            self._live.discard(thread)
            self._stuck += 1
        self._grow()

    def close(self) -> None:
        """Stop the live threads once the tasks queued before are done (stuck ones end when they return)."""
        with self._lock:
            self._closed = True
            count = len(self._live)
        for _ in range(count):
            self._tasks.put(None)

    def _grow(self) -> None:
        with self._lock:
            while not self._closed and len(self._live) < self.size and self._stuck <= self.max_stuck:
                thread = threading.Thread(
                    target=self._work, name=f"iqgraph-owner-field-{next(self._names)}", daemon=True
                )
                self._live.add(thread)
                thread.start()

    def _work(self) -> None:
        me = threading.current_thread()
        while True:
            task = self._tasks.get()
            if task is None:
                with self._lock:
                    self._live.discard(me)
                return
            task.run_in(me)
            with self._lock:
                if me not in self._live:  # abandoned while it ran: its replacement works on
                    self._stuck -= 1
                    return


def _found(routing: StoreDefinition, stores: Sequence[PartitionStores], keys: list[Key]) -> list[bool]:
    """Return per key whether the routing store holds it in any of the partitions' stores."""
    found = [False] * len(keys)
    for partition in stores:
        here = partition.store(routing.name).contains_many(keys)
        found = [a or b for a, b in zip(found, here, strict=True)]
    return found


class OwnerFieldRunner:
    """Run owner-side fields on the partitions a LocalPartitions hosts, in worker threads."""

    def __init__(
        self, local: LocalPartitions, *, workers: int = DEFAULT_WORKERS, max_stuck: int = MAX_STUCK_THREADS
    ) -> None:
        self.local = local
        self.workers = workers
        self._workers = _Workers(workers, max_stuck)
        self._fields: dict[str, _Field] = {}

    @property
    def stuck_threads(self) -> int:
        """Return how many worker threads are left running a function past its key's timeout."""
        return self._workers.stuck

    async def call(self, field: str, calls: Sequence[Call], caller: Principal = ANONYMOUS) -> Answer[list[Any]]:
        """Return field's value per (key, partitions), in call order: an Owned, or a replica's error.

        caller: whom the function reads for (a store it may not read is that key's FORBIDDEN).
        """
        arrived = time.monotonic()
        app = self.local.app
        owner = owner_field_of(app, field)
        run = self._fields.get(field)
        if run is None or run.owner is not owner:
            run = self._fields[field] = _Field(owner)
        routing = definition_of(app, owner.store)
        groups: dict[tuple[int, ...], list[int]] = defaultdict(list)
        for i, (_, partitions) in enumerate(calls):
            groups[tuple(sorted(partitions))].append(i)
        answer: Answer[list[Any]] = Answer([None] * len(calls), kafka_away_since=self.local.kafka_away_since())
        runs: list[int] = []
        jobs: list[tuple[Key, StoreViews, bool]] = []
        for partitions, indexes in groups.items():
            keys = [calls[i][0] for i in indexes]
            found = self._read_marks(routing, partitions, keys, answer)
            if isinstance(found, Exception):
                for i in indexes:
                    answer.value[i] = found
                continue
            views = LocalStoreViews(self.local, routing, partitions, caller)
            runs += indexes
            jobs += [(key, views, f) for key, f in zip(keys, found, strict=True)]
        for i, value in zip(runs, await self._run_all(run, jobs, arrived), strict=True):
            answer.value[i] = value
        return answer

    def _read_marks(
        self, routing: StoreDefinition, partitions: Sequence[int], keys: list[Key], answer: Answer[Any]
    ) -> list[bool] | Exception:
        """Add the partitions' positions and lags to answer (read before the data) and return per key whether
        the routing store holds it there; or return why they can't be read.

        The lookups' own checks (``LocalPartitions``): not hosted → STORE_MIGRATED, not queryable → STORE_NOT_READY.
        """
        stores, positions, lags = self.local.positions(routing, partitions)
        refused = next((e for e in stores.values() if isinstance(e, StoreError)), None)
        if refused is not None:
            return refused
        try:
            found = _found(routing, [s for s in stores.values() if isinstance(s, PartitionStores)], keys)
        except StoreNotReadyError as exc:
            return exc
        answer.positions.update(positions)
        answer.lags.update(lags)
        return found

    async def _run_all(self, run: _Field, jobs: list[tuple[Key, StoreViews, bool]], arrived: float) -> list[Any]:
        """Return each key's answer once every key is answered or timed out."""
        if not jobs:
            return []
        stuck = self._workers.stuck
        if stuck >= self._workers.max_stuck:
            log.error(
                "owner-side field %s: %d worker threads are stuck in functions past their timeout (the limit): "
                "its %d keys answer TIMEOUT at once until some return",
                run.name,
                stuck,
                len(jobs),
            )
            error = run.timeout(f"was not run: {stuck} worker threads are stuck in functions past their timeout")
            return [Owned(found, error) for _, _, found in jobs]
        loop = asyncio.get_running_loop()
        tasks = [_Task(_bound(run, key, views, found), loop) for key, views, found in jobs]
        for task in tasks:
            self._workers.submit(task)
        limit, last = run.timeout_s, arrived + OWNER_FIELD_MAX_TIMEOUT_S
        try:
            while True:
                now, deadlines, waiting = time.monotonic(), [], []
                for task, (key, _, found) in zip(tasks, jobs, strict=True):
                    if task.state in (_DONE, _EXPIRED):
                        continue
                    deadline = arrived + limit if task.state == _PENDING else min(task.started + limit, last)
                    if now >= deadline:
                        self._expire(run, task, key, found, limit)
                    else:
                        deadlines.append(deadline)
                        waiting.append(task.done)
                if not waiting:
                    break
                await asyncio.wait(waiting, timeout=min(deadlines) - now, return_when=asyncio.FIRST_COMPLETED)
        finally:  # cancelled (the client left): no one watches the keys still waiting or running
            for task in tasks:
                state, thread = task.expire(None)
                if state == _RUNNING and thread is not None:
                    self._workers.abandon(thread)
        return [task.result for task in tasks]

    def _expire(self, run: _Field, task: _Task, key: Key, found: bool, limit: float) -> None:
        if task.state == _PENDING:
            why = f"waited {limit:g} s for a free worker (every one busy)"
        elif task.started + limit <= time.monotonic():
            why = f"ran longer than {limit:g} s"
        else:
            why = f"did not finish within the {OWNER_FIELD_MAX_TIMEOUT_S:g} s a node has for a batch"
        state, thread = task.expire(Owned(found, run.timeout(why)))
        if state == _DONE:
            return
        log.warning("owner-side field %s timed out for key %r: it %s", run.name, key, why)
        if state == _RUNNING and thread is not None:  # its thread runs on, its answer dropped: replace it
            self._workers.abandon(thread)

    def close(self) -> None:
        """Stop the worker threads once their functions return (daemon threads: a stuck one holds no exit)."""
        self._workers.close()


def _bound(run: _Field, key: Key, views: StoreViews, found: bool) -> Callable[[], Any]:
    return lambda: run.run(key, views, found)
