"""The partitions a node hosts, and each one's lifecycle: opened, restored, RESTORING, RUNNING, closed.

`HostedPartitions` owns every hosted partition's stores and moves them through their states; the query runner
(``streaming.runner``) only runs the streaming queries over the ones it hands out. Nothing here needs Spark: a node
opens and restores its partitions, and serves them, while its Spark session is still starting.

On `assign`, each partition is opened from its state directory and checked (its stores built for the topic's
partition count), then, with changelogs (``streaming.changelog``):

- the active copy fences the changelog's last writer and restores what it lacks from the changelog (all of it on an
  empty state dir; all of it, too, when its copy is older than half the changelog's tombstone retention and the
  changelog moved on: a tail read could miss a purged delete);
- a standby copy is kept by the `ChangelogFollower` instead of a pipeline.

Then, against the input topic: a table's copy that stopped applying longer ago than the topic keeps tombstones is
rebuilt; one whose next offset Kafka deleted is DATA_LOST (or rebuilt with ``rebuild_lost``); a new one starts at
the earliest offset Kafka holds. An active partition is then RESTORING until it has applied everything the topic
held when it was opened (`mark_running_when_caught_up`, called on each committed batch), then RUNNING. `revoke`
closes the partitions no longer hosted (their data stays on disk, their changelog let go of).

quix-streams' ``StateStoreManager.on_partition_assign/revoke`` is the model.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from iqgraph.stores import PartitionState, PartitionStores, StateDirectory
from iqgraph.stores.changelog import BATCH_END_KEY, apply_records, changelog_next
from iqgraph.stores.codecs import encode_int64
from iqgraph.streaming.changelog import Changelogs, ensure_changelog_topics
from iqgraph.streaming.changelog_follower import ChangelogFollower
from iqgraph.streaming.definitions import App
from iqgraph.streaming.kafka_offsets import KafkaOffsets
from iqgraph.streaming.runner_settings import RunnerSettings
from iqgraph.streaming.topic_config import tombstone_retention_s

log = logging.getLogger(__name__)

Assignment = Mapping[str, Iterable[int]]


def mark_running_when_caught_up(stores: PartitionStores, target: int) -> None:
    """Move a restoring partition to RUNNING once it has applied everything up to target."""
    if stores.db.state is PartitionState.RESTORING and stores.db.next_offset() >= target:
        stores.db.set_state(PartitionState.RUNNING)


@dataclass(frozen=True)
class PartitionStatus:
    """One owned partition: its state, the offset applied up to, the topic's end, and the lag."""

    topic: str
    partition: int
    state: str
    applied_offset: int
    end_offset: int

    @property
    def lag(self) -> int:
        """Return how many records the store is behind the topic."""
        return max(self.end_offset - self.applied_offset, 0)


class HostedPartitions:
    """The stores of the partitions one node hosts, opened, restored and moved through their states."""

    def __init__(
        self,
        app: App,
        state_dir: StateDirectory,
        settings: RunnerSettings,
        role: Callable[[str, int], str] | None = None,
    ) -> None:
        """Args:
        role: "active" or "standby" of a hosted partition (None: this node is the active copy of all it hosts).
        """
        self.app = app
        self.state_dir = state_dir
        self.settings = settings
        self.role = role or (lambda topic, partition: "active")
        self.partitions: dict[str, dict[int, PartitionStores]] = {}
        self._targets: dict[tuple[str, int], int] = {}  # the end offset each active copy restores up to
        self._offsets: dict[str, KafkaOffsets] = {}
        producing = {**settings.client_config, **(settings.producer_config or {})}
        self.changelogs = Changelogs(producing, app.name) if settings.changelog else None
        self.follower = ChangelogFollower(self.changelogs) if self.changelogs is not None else None
        self._changelogs_made = False

    def assign(self, assignment: Assignment) -> dict[str, list[int]]:
        """Open the assigned partitions (kept open ones stay as they are) and restore them; return, per topic, the
        ones this node runs the pipeline of (the others follow their changelog)."""
        if self.changelogs is not None and not self._changelogs_made:
            ensure_changelog_topics(self.changelogs.config, self.app)
            self._changelogs_made = True
        owned = {t.name: sorted(set(assignment.get(t.name, ()))) for t in self.app.topics}
        owned = {topic: partitions for topic, partitions in owned.items() if partitions}
        active = {topic: [p for p in ps if not self.followed(topic, p)] for topic, ps in owned.items()}
        for topic, partitions in owned.items():  # every topic's partitions open before any query runs: a
            self._follow(topic, [p for p in partitions if p not in active[topic]])  # join's first batch finds
            self._open(topic, active[topic])  # its table's partitions (streaming.joins)
        return active

    def readable(self, topic: str, partitions: Iterable[int]) -> list[int]:
        """Return those of topic's open partitions that a pipeline may apply to (not DATA_LOST)."""
        open_now = self.partitions.get(topic, {})
        return [p for p in partitions if p in open_now and open_now[p].db.state is not PartitionState.DATA_LOST]

    def revoke(self, keep: Assignment) -> None:
        """Close the open partitions not in keep (their data stays on disk) and let go of their changelogs."""
        for topic, open_now in self.partitions.items():
            kept = set(keep.get(topic, ()))
            for partition in [p for p in open_now if p not in kept]:
                if self.follower is not None:
                    self.follower.release(topic, partition)
                if self.changelogs is not None and self.logged(topic):
                    self.changelogs.writer(topic).release(partition)
                open_now.pop(partition).close()

    def hosted(self) -> dict[str, list[int]]:
        """Return the partitions open now, per topic."""
        return {topic: sorted(open_now) for topic, open_now in self.partitions.items()}

    def on_commit(self, topic: str) -> Callable[[int, int], None]:
        """Return what a sink of topic calls once a batch of a partition is committed: its restore may be over."""

        def committed(partition: int, next_offset: int) -> None:
            stores = self.partitions.get(topic, {}).get(partition)
            if stores is not None:
                mark_running_when_caught_up(stores, self._targets.get((topic, partition), 0))

        return committed

    def last_applied(self) -> float:
        """Return the wall-clock time of the last batch applied to any open partition (0 if none is open)."""
        return max((s.db.applied_at for ps in list(self.partitions.values()) for s in list(ps.values())), default=0.0)

    def status(self) -> list[PartitionStatus]:
        """Return the state and lag of every open partition."""
        result = []
        for topic, open_now in sorted(self.partitions.items()):
            ends = self.offsets(topic).latest(open_now)
            for partition, stores in sorted(open_now.items()):
                db = stores.db
                result.append(
                    PartitionStatus(topic, partition, db.state.value, db.next_offset(), ends.get(partition, 0))
                )
        return result

    def close(self) -> None:
        """Stop following changelogs, let go of the changelogs, and close every partition's stores."""
        if self.follower is not None:
            self.follower.stop()
        if self.changelogs is not None:
            self.changelogs.close()
        for open_now in self.partitions.values():
            for stores in open_now.values():
                stores.close()
        self.partitions.clear()
        self._offsets.clear()

    def offsets(self, topic: str) -> KafkaOffsets:
        """Return the long-lived offsets client of topic."""
        if topic not in self._offsets:
            self._offsets[topic] = KafkaOffsets(self.settings.client_config, topic)
        return self._offsets[topic]

    def logged(self, topic: str) -> bool:
        """Return whether topic's stores keep a changelog (on, and not a global table)."""
        return self.changelogs is not None and not self.app.topic(topic).global_table

    def followed(self, topic: str, partition: int) -> bool:
        """Return whether this node keeps partition by following its changelog (a standby's copy)."""
        return self.settings.follow_changelog and self.writes_changelog(topic, partition) is False

    def writes_changelog(self, topic: str, partition: int) -> bool | None:
        """Return whether this node writes partition's changelog (its active copy); None: topic keeps none."""
        if not self.logged(topic):
            return None
        return self.role(topic, partition) == "active"

    def fenced_since(self, topic: str, partition: int) -> float | None:
        """Return when (time.monotonic()) another copy took partition's changelog over from this node's writer, if
        it did since this node last took it (None: never, or the topic keeps no changelog)."""
        if self.changelogs is None or not self.logged(topic):
            return None
        return self.changelogs.writer(topic).fenced.get(partition)

    def _follow(self, topic: str, followed: list[int]) -> None:
        """Open the standby copies of topic's partitions followed, each kept by the changelog follower."""
        if not followed:
            return
        assert self.follower is not None and self.changelogs is not None  # noqa: S101 - followed() says so
        open_now = self.partitions.setdefault(topic, {})
        already = set(self.follower.followed())
        writer = self.changelogs.writer(topic)
        ends = self.offsets(topic).latest(followed)
        tail_ok = self._tail_readable(topic, [p for p in followed if p not in open_now and (topic, p) not in already])
        for partition in followed:
            writer.release(partition)  # an active copy demoted: it writes the changelog no more
            if (topic, partition) in already:
                continue
            stores = open_now.get(partition) or tail_ok(self.state_dir.open(topic, partition, self.app.specs(topic)))
            open_now[partition] = stores
            stores.db.topic_partitions(self.app.topic(topic).partitions)
            self.follower.follow(topic, stores, ends[partition])

    def _open(self, topic: str, owned: list[int]) -> None:
        open_now = self.partitions.setdefault(topic, {})
        ends = self.offsets(topic).latest(owned)
        earliest = self.offsets(topic).earliest(owned)
        horizon = tombstone_retention_s(self.settings.client_config, topic) if self.app.topic(topic).table else None
        kept_before = {partition: open_now.get(partition) for partition in owned}
        tail_ok = self._tail_readable(topic, [p for p in owned if kept_before[p] is None])
        for partition in owned:
            if self.follower is not None:
                self.follower.release(topic, partition)  # a standby promoted: the pipeline keeps it from now on
            stores = open_now.get(partition) or tail_ok(self.state_dir.open(topic, partition, self.app.specs(topic)))
            open_now[partition] = stores
            stores.db.topic_partitions(self.app.topic(topic).partitions)  # refuses stores built for another count
        self._restore(topic, {partition: open_now[partition] for partition in owned})
        for partition in owned:
            kept, stores = kept_before[partition], open_now[partition]
            if kept is None and horizon is not None:  # after the restore: a changelog last written before the
                stores = self._tombstones_kept(stores, horizon)  # horizon may miss purged deletes as a disk may
            open_now[partition] = stores = self._from_log_start(stores, earliest[partition])
            stores.db.topic_partitions(self.app.topic(topic).partitions)  # recorded anew in rebuilt stores
            self._targets[(topic, partition)] = ends[partition]
            if stores.db.state is PartitionState.DATA_LOST:
                continue  # not read: what it holds can never be complete again
            if kept is stores and stores.db.state is PartitionState.RUNNING:
                continue  # kept through a reassignment: its data stays valid, it only pauses while the query restarts
            stores.db.set_state(PartitionState.RESTORING)
            mark_running_when_caught_up(stores, ends[partition])

    def _tail_readable(self, topic: str, partitions: list[int]) -> Callable[[PartitionStores], PartitionStores]:
        """Return a check for copies of topic's partitions opened from disk: one that last applied a changelog batch
        longer ago than half the time the changelog keeps tombstones (delete.retention.ms) while the changelog has
        batches past it is emptied, and restores the whole changelog: reading only the tail, it could miss deletes
        the cleaner purged since (a key deleted would stay, wrongly). A copy with nothing to read keeps its state."""
        if self.changelogs is None or not self.logged(topic) or not partitions:
            return lambda stores: stores
        changelogs = self.changelogs
        horizon = tombstone_retention_s(changelogs.config, changelogs.topic(topic))
        ends = changelogs.end_offsets(topic, partitions)

        def check(stores: PartitionStores) -> PartitionStores:
            db = stores.db
            position, committed = changelog_next(db), db.committed_at()
            if horizon is None or position == 0 or ends.get(db.partition, 0) <= position:
                return stores
            if committed is not None and time.time() - committed < horizon / 2:
                return stores
            log.warning(
                "%s-%s: its copy last applied a changelog batch %s ago, longer than half the time %s keeps "
                "tombstones (%.0f s): restoring the whole changelog so that no purged delete is missed",
                db.topic,
                db.partition,
                "an unknown time" if committed is None else f"{time.time() - committed:.0f} s",
                changelogs.topic(topic),
                horizon,
            )
            db.delete()
            return self.state_dir.open(db.topic, db.partition, self.app.specs(db.topic))

        return check

    def _restore(self, topic: str, opened: Mapping[int, PartitionStores]) -> None:
        """Take over (or let go of) each partition's changelog and restore the stores from it, the partitions at
        once: one's fetch, fence and RocksDB writes overlap another's (they were 6 restores end to end)."""
        if self.changelogs is None or not opened:
            return
        changelogs = self.changelogs

        def fence(partition: int) -> None:
            if self.writes_changelog(topic, partition):  # fence the last writer first (its open transaction is
                changelogs.writer(topic).take_over(partition)  # aborted, so the restore's end is its last batch)
            elif self.logged(topic):
                changelogs.writer(topic).release(partition)  # a standby running the pipeline writes none

        with ThreadPoolExecutor(max_workers=len(opened), thread_name_prefix=f"restore-{topic}") as pool:
            for fenced in [pool.submit(fence, partition) for partition in opened]:
                fenced.result()  # the first failure is raised, after every one ended
            if not self.logged(topic):
                return
            targets = changelogs.end_offsets(topic, sorted(opened))
            restores = [pool.submit(changelogs.restore, topic, opened[p], target=targets[p]) for p in opened]
            for done in restores:
                done.result()

    def _tombstones_kept(self, stores: PartitionStores, horizon_s: float) -> PartitionStores:
        """Return a table partition's stores, rebuilt from scratch if they stopped applying longer ago than the
        topic keeps tombstones (horizon_s): deletes purged since would be missed for good (streaming.topic_config).
        """
        committed = stores.db.committed_at()
        if stores.db.next_offset() == 0 or (committed is not None and time.time() - committed < horizon_s):
            return stores
        idle = "an unknown time" if committed is None else f"{time.time() - committed:.0f} s"
        log.warning(
            "%s-%s: table stores last applied %s ago, longer than the topic keeps tombstones (delete.retention.ms "
            "%.0f s): rebuilding from the earliest offset so that no purged delete is missed",
            stores.db.topic,
            stores.db.partition,
            idle,
            horizon_s,
        )
        return self._recreate(stores)

    def _recreate(self, stores: PartitionStores, start: int = 0) -> PartitionStores:
        """Delete a partition's stores and return new, empty ones in their place, reading the topic from start.

        With a changelog, the changelog is emptied too (a tombstone for every entry, in one transaction): a copy
        restored from it later must not find what the rebuild dropped.
        """
        db = stores.db
        reset = None
        if self.writes_changelog(db.topic, db.partition):
            assert self.changelogs is not None  # noqa: S101 - logged() says so
            reset = self.changelogs.writer(db.topic).reset(db, start)
        db.delete()
        rebuilt = self.state_dir.open(db.topic, db.partition, self.app.specs(db.topic))
        if reset is not None:
            apply_records(rebuilt.db, [(BATCH_END_KEY, encode_int64(start))], reset)
        elif start:
            rebuilt.db.start_at(start)
        return rebuilt

    def _from_log_start(self, stores: PartitionStores, first: int) -> PartitionStores:
        """Return the stores to read a partition into, given the first offset Kafka still holds (retention).

        A database that applied nothing starts there. One whose next offset Kafka deleted lost records
        [next, first): it is DATA_LOST (its reads fail with the range and what to do), or, with rebuild_lost,
        deleted and rebuilt from first (the lost range stays on it, for the metrics).
        """
        db = stores.db
        applied = db.next_offset()
        if applied >= first:
            return stores
        if db.lost is None and applied == 0:
            db.start_at(first)  # a new copy reads what the topic holds, as a consumer from the earliest offset
            return stores
        lost = db.lost or (applied, first)
        log.error(
            "%s-%s: Kafka deleted records %d..%d before this node applied them (retention)%s",
            db.topic,
            db.partition,
            lost[0],
            lost[1] - 1,
            ": rebuilding from the earliest offset"
            if self.settings.rebuild_lost
            else ": the partition answers DATA_LOST; restart with --rebuild-lost-partitions to rebuild it",
        )
        if not self.settings.rebuild_lost:
            db.mark_lost(*lost)
            return stores
        rebuilt = self._recreate(stores, first)
        rebuilt.db.lost = lost
        return rebuilt
