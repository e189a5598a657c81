"""Spark's offset log as the sink reads it: where each micro-batch of a query read every partition (`OffsetLog`).

The sink moves a partition's next offset to the batch's end offset even past offsets that hold no record (control
markers, aborted or compacted records), which only the offset log says (``streaming.sink``).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class BatchOffsets:
    """Where one micro-batch's source read each partition: from `starts` (None: not known) up to `ends`."""

    starts: Mapping[int, int] | None
    ends: Mapping[int, int]


class OffsetLog:
    """The offsets each micro-batch of one query read, from Spark's offset log (its write-ahead log).

    Spark writes ``<checkpoint>/offsets/<batchId>`` before it runs the batch: a version line (``v1``, or ``v2``
    for named sources in Spark 4.1+), a metadata line, then the batch's END offset of each source — one JSON per
    line in v1 (``-`` for a source without one), ``<sourceId>:<json>`` per line in v2. A query here has one
    source: Spark's Kafka source writes ``{"<topic>": {"<partition>": offset}}``, the iqkafka source
    ``{"<partition>": offset}``. A batch starts where the one before it ended; batch 0 where the query started
    (starting, the stores' offsets the runner gave the source). A file that cannot be read or parsed yields None
    (logged once): the sink then moves offsets only past the records it got, as without a log.
    """

    def __init__(self, directory: Path, topic: str, starting: Mapping[int, int] | None = None) -> None:
        self.directory = directory
        self.topic = topic
        self.starting = dict(starting) if starting is not None else None
        self._warned = False

    def batch(self, batch_id: int) -> BatchOffsets | None:
        """Return where batch batch_id read each partition, None when the log does not say."""
        ends = self.ends(batch_id)
        if ends is None:
            return None
        starts = self.starting if batch_id == 0 else self.ends(batch_id - 1)
        return BatchOffsets(starts, ends)

    def ends(self, batch_id: int) -> dict[int, int] | None:
        """Return the end offsets of batch batch_id, None when the log does not say."""
        path = self.directory / str(batch_id)
        try:
            return self.parse(path.read_text(encoding="utf-8"))
        except (OSError, ValueError, TypeError, KeyError, AttributeError) as exc:
            if not self._warned:
                self._warned = True
                log.warning(
                    "%s: no end offsets in Spark's offset log %s (%s): offsets move past records", self.topic, path, exc
                )
            return None

    def parse(self, text: str) -> dict[int, int]:
        """Return the partition -> end offset map of an offset log file's text; raise ValueError if it has none."""
        lines = text.split("\n")
        version = lines[0].strip()
        if version not in ("v1", "v2") or len(lines) < 3:
            raise ValueError(f"unknown offset log format {version!r}")
        entries = [line for line in lines[2:] if line.strip() and line.strip() != "-"]
        if version == "v2":
            entries = [_v2_offset(line) for line in entries]
        offsets = [json.loads(entry) for entry in entries if entry != "-"]
        if len(offsets) != 1:
            raise ValueError(f"{len(offsets)} source offsets, expected one")
        return self._partition_offsets(offsets[0])

    def _partition_offsets(self, offset: Any) -> dict[int, int]:
        """Return the partition offsets of one source's offset JSON (Spark's Kafka source's or iqkafka's)."""
        if not isinstance(offset, dict):
            raise ValueError(f"not a Kafka source offset: {offset!r}")
        if self.topic in offset and isinstance(offset[self.topic], dict):
            offset = offset[self.topic]  # Spark's Kafka source: {"<topic>": {"<partition>": offset}}
        return {int(partition): int(value) for partition, value in offset.items()}


def _v2_offset(line: str) -> str:
    """Return the offset JSON of a v2 offset log line, ``<sourceId>:<json>``."""
    source, colon, offset = line.partition(":")
    if not colon or not offset:
        raise ValueError(f"not a v2 offset log line: {line!r}")
    return offset
