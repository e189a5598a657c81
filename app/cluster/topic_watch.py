"""What a node keeps watching about its topics: end offsets (for lags) and the producers' partitioner.

A background thread refreshes, every ``interval_s``:
- the end offset of every hosted partition (one ListOffsets per topic, over the runner's long-lived admin
  client), so a read reports its lag without asking Kafka — a lag is at most one interval old;
- per topic, the partitioner the producers use, detected from the evidence the sink keeps in each hosted
  partition's meta counters (``streaming.partitioner``). An explicit setting wins over detection; a node
  that hosts no partition of a topic yet sees no evidence: "unknown" (reads ask both candidates).

While a topic's detection is still "unknown" (or not made yet), ``partitioner`` detects again on the spot
from the counters (no Kafka call): the first records a node applies are routed by at once, not one refresh
interval later — a node turns ready as soon as its partitions catch up, before the thread's next round.

It also reads each hosted topic's partition count (a metadata request on the same client): once the count is not
the one the stores were built for — partitions were added while the nodes ran — every hosted partition of the
topic turns REPARTITIONED (reads answer TOPIC_REPARTITIONED saying what to do, /readyz 503), within one interval:
routing by the old count would silently miss the keys now produced to other partitions.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping

from iqgraph.stores import PartitionStores
from iqgraph.streaming.definitions import Partitioner
from iqgraph.streaming.partitioner import PartitionerEvidence, evidence_from_counters, resolve

log = logging.getLogger(__name__)
EndOffsets = Callable[[str, list[int]], Mapping[int, int]]
PartitionCount = Callable[[str], int]


class TopicWatch:
    """End offsets of hosted partitions and the detected partitioner of each topic, refreshed in a thread."""

    def __init__(
        self,
        partitions: Mapping[str, Mapping[int, PartitionStores]],
        end_offsets: EndOffsets,
        partitioner: Partitioner,
        interval_s: float = 0.5,
        partition_count: PartitionCount | None = None,
    ) -> None:
        self.partitions = partitions
        self.end_offsets = end_offsets
        self.configured = partitioner
        self.interval_s = interval_s
        self.partition_count = partition_count
        #: topic -> (partitions the stores were built for, partitions the topic has now), once they differ
        self.repartitioned: dict[str, tuple[int, int]] = {}
        self._ends: dict[tuple[str, int], int] = {}
        self._detected: dict[str, str] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="topic-watch", daemon=True)

    def start(self) -> None:
        """Refresh once now, then every interval in the background."""
        self.refresh()
        self._thread.start()

    def stop(self) -> None:
        """Stop refreshing."""
        self._stop.set()

    def end_offset(self, topic: str, partition: int) -> int | None:
        """Return the end offset of topic-partition as last seen (None: not seen yet)."""
        return self._ends.get((topic, partition))

    def partitioner(self, topic: str) -> str:
        """Return the partitioner to route topic's keys by (configured, or detected under auto)."""
        if self.configured != "auto":
            return self.configured
        detected = self._detected.get(topic, "unknown")
        if detected == "unknown":
            detected = self._detect(topic)
        return detected

    def refresh(self) -> None:
        """Read the end offsets and the partitioner evidence now."""
        for topic, hosted in list(self.partitions.items()):
            owned = sorted(hosted)
            if not owned:
                continue
            try:
                for p, end in self.end_offsets(topic, owned).items():
                    self._ends[topic, p] = end
            except Exception as exc:  # noqa: BLE001 - Kafka away for a moment: keep the last values
                log.debug("end offsets of %s: %s", topic, exc)
            self._detect(topic)
            self._check_partition_count(topic)

    def _check_partition_count(self, topic: str) -> None:
        """Mark every hosted partition of topic REPARTITIONED once its partition count changed."""
        if self.partition_count is None:
            return
        try:
            found = self.partition_count(topic)
        except Exception as exc:  # noqa: BLE001 - Kafka away for a moment: the next round asks again
            log.debug("partition count of %s: %s", topic, exc)
            return
        for stores in list(self.partitions.get(topic, {}).values()):
            try:
                if stores.db.topic_partitions() == found:
                    return
                stores.db.mark_repartitioned(found)
            except Exception:  # noqa: BLE001,S112 - a partition closing while it moves
                continue
            if topic not in self.repartitioned:
                log.error("%s", stores.db.not_queryable())
            self.repartitioned[topic] = stores.db.repartitioned or (0, found)

    def _detect(self, topic: str) -> str:
        """Detect topic's partitioner from its hosted partitions' counters now, and keep the result."""
        evidence = PartitionerEvidence()
        for stores in list(self.partitions.get(topic, {}).values()):
            try:
                evidence += evidence_from_counters(stores.db.counter)
            except Exception:  # noqa: BLE001,S112 - a partition closing while it moves
                continue
        detected = self._detected[topic] = resolve("auto", evidence)
        return detected

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.refresh()
            except Exception:  # a failed round must not end the watch: the next one may succeed
                log.exception("topic watch: refresh failed; retrying in %.1f s", self.interval_s)
