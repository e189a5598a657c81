"""The producers' partitioner: which partition a key's records go to (invariant 4).

murmur2 is the Kafka Java client's default (librdkafka's ``murmur2_random`` for keyed records);
``consistent_random`` is librdkafka's CRC32 partitioner and confluent-kafka's default. Keys are hashed
in their serialized form: UTF-8 for string keys, 8-byte big-endian for long keys (Kafka's LongSerializer).

With ``KafkaSettings.partitioner = "auto"`` the partitioner is detected per topic from the records
themselves: for each batch and partition, the sink sorts the batch's distinct keys by which hash puts
them on the partition they arrived on (``PartitionerEvidence``: murmur2 only, CRC32 only, both — the
hashes agree —, neither) and adds the counts to the partition database's meta counters
(``EVIDENCE_COUNTERS``). ``detect`` turns the evidence summed over a topic's partitions into a verdict,
``candidate_partitions`` into the partitions a key may live in.
"""

from __future__ import annotations

import functools
import zlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, fields
from types import MappingProxyType
from typing import Final, Literal, NamedTuple

import numpy as np

from iqgraph.streaming.definitions import KeyFormat, Partitioner

#: What detect() concludes about a topic's producers (the first two are also explicit partitioner names).
Detection = Literal["murmur2", "consistent_random", "mixed", "unexplained", "unknown"]

_M = 0x5BD1E995
_MASK = 0xFFFFFFFF


def murmur2(data: bytes) -> int:
    """Return Kafka's murmur2 hash of data (seed 0x9747b28c) as an unsigned 32-bit int."""
    length = len(data)
    h = (0x9747B28C ^ length) & _MASK
    full = length - length % 4
    for i in range(0, full, 4):
        k = int.from_bytes(data[i : i + 4], "little")
        k = (k * _M) & _MASK
        k ^= k >> 24
        k = (k * _M) & _MASK
        h = ((h * _M) & _MASK) ^ k
    rest = length % 4
    if rest == 3:
        h ^= data[full + 2] << 16
    if rest >= 2:
        h ^= data[full + 1] << 8
    if rest >= 1:
        h ^= data[full]
        h = (h * _M) & _MASK
    h ^= h >> 13
    h = (h * _M) & _MASK
    h ^= h >> 15
    return h


def murmur2_many(keys: Sequence[bytes]) -> list[int]:
    """Return murmur2 of each key, computed with numpy over the keys of each length at once.

    The same hash as murmur2, per 32-bit block, in uint64 lanes masked to 32 bits (a product of two
    32-bit values wraps modulo 2**64, which keeps its low 32 bits exact). A length shared by fewer than
    _VECTOR_MIN keys is hashed one by one.
    """
    found = [0] * len(keys)
    by_length: dict[int, list[int]] = {}
    for index, key in enumerate(keys):
        by_length.setdefault(len(key), []).append(index)
    for length, indexes in by_length.items():
        if len(indexes) < _VECTOR_MIN:
            for i in indexes:
                found[i] = murmur2(keys[i])
            continue
        for i, h in zip(indexes, _murmur2_same_length([keys[i] for i in indexes], length), strict=True):
            found[i] = h
    return found


_VECTOR_MIN = 16


def _murmur2_same_length(keys: list[bytes], length: int) -> list[int]:
    data = np.frombuffer(b"".join(keys), dtype=np.uint8).reshape(len(keys), length).astype(np.uint64)
    m, mask = np.uint64(_M), np.uint64(_MASK)
    h = np.full(len(keys), (0x9747B28C ^ length) & _MASK, dtype=np.uint64)
    full = length - length % 4
    for i in range(0, full, 4):
        k = data[:, i] | (data[:, i + 1] << np.uint64(8)) | (data[:, i + 2] << np.uint64(16))
        k |= data[:, i + 3] << np.uint64(24)
        k = (k * m) & mask
        k ^= k >> np.uint64(24)
        k = (k * m) & mask
        h = ((h * m) & mask) ^ k
    rest = length % 4
    if rest == 3:
        h ^= data[:, full + 2] << np.uint64(16)
    if rest >= 2:
        h ^= data[:, full + 1] << np.uint64(8)
    if rest >= 1:
        h ^= data[:, full]
        h = (h * m) & mask
    h ^= h >> np.uint64(13)
    h = (h * m) & mask
    h ^= h >> np.uint64(15)
    return [int(v) for v in h.tolist()]


def murmur2_partition(key: bytes, partitions: int) -> int:
    """Return the partition the Java client (and librdkafka murmur2_random) picks for key."""
    return (murmur2(key) & 0x7FFFFFFF) % partitions


def crc32_partition(key: bytes, partitions: int) -> int:
    """Return the partition librdkafka's consistent_random picks for key."""
    return zlib.crc32(key) % partitions


PARTITIONERS: dict[str, Callable[[bytes, int], int]] = {
    "murmur2": murmur2_partition,
    "consistent_random": crc32_partition,
}


def serialize_key(key: str | int, key_format: KeyFormat) -> bytes:
    """Return the bytes a producer sends for key."""
    if key_format == "long":
        return int(key).to_bytes(8, "big", signed=True)
    return str(key).encode("utf-8")


@functools.lru_cache(maxsize=1 << 16)
def partition_for(key: str | int, partitions: int, key_format: KeyFormat, partitioner: Partitioner) -> int:
    """Return the partition of key for a topic with the given partition count (recent keys are cached)."""
    # "auto" routes as murmur2 here until routing asks detect() / candidate_partitions() instead.
    name = "murmur2" if partitioner == "auto" else partitioner
    return PARTITIONERS[name](serialize_key(key, key_format), partitions)


class Placement(NamedTuple):
    """The partition each partitioner puts one key on."""

    murmur2: int
    consistent_random: int


def placement(key: bytes, partitions: int) -> Placement:
    """Return where murmur2 and CRC32 put key (serialized) among partitions."""
    return Placement(murmur2_partition(key, partitions), crc32_partition(key, partitions))


def explained(where: Placement, partition: int, partitioner: Partitioner) -> bool:
    """Return whether partitioner puts a key placed as where on partition ("auto": either hash does)."""
    if partitioner == "auto":
        return partition in where
    return (where.murmur2 if partitioner == "murmur2" else where.consistent_random) == partition


@dataclass(frozen=True)
class PartitionerEvidence:
    """How many distinct keys each partitioner explains: only murmur2, only CRC32, both, neither.

    A key is counted once per batch and partition it arrives on; counts add up over batches and partitions.
    """

    murmur2: int = 0
    consistent_random: int = 0
    both: int = 0
    neither: int = 0

    def __add__(self, other: PartitionerEvidence) -> PartitionerEvidence:
        return PartitionerEvidence(*(getattr(self, f.name) + getattr(other, f.name) for f in fields(self)))


#: The partition database meta counters (PartitionDB.counter) that keep each field of the evidence.
EVIDENCE_COUNTERS: Final[Mapping[str, str]] = MappingProxyType(
    {f.name: f"partitioner:{f.name}" for f in fields(PartitionerEvidence)}
)

#: (murmur2 puts the key here, CRC32 does) -> the evidence field the key counts in.
_EXPLAINED_BY: Final[Mapping[tuple[bool, bool], str]] = MappingProxyType(
    {(True, True): "both", (True, False): "murmur2", (False, True): "consistent_random", (False, False): "neither"}
)


def evidence_of(placements: Iterable[Placement], partition: int) -> PartitionerEvidence:
    """Return the evidence of distinct keys that arrived on partition, given where each hash puts them."""
    counts = dict.fromkeys(EVIDENCE_COUNTERS, 0)
    for where in placements:
        counts[_EXPLAINED_BY[where.murmur2 == partition, where.consistent_random == partition]] += 1
    return PartitionerEvidence(**counts)


def evidence_from_counters(counter: Callable[[str], int]) -> PartitionerEvidence:
    """Return the evidence kept in one partition database's counters (pass ``db.counter``)."""
    return PartitionerEvidence(**{name: counter(kept) for name, kept in EVIDENCE_COUNTERS.items()})


def detect(evidence: PartitionerEvidence) -> Detection:
    """Return which partitioner the evidence shows the producers use.

    "unexplained" if any key fits neither hash; "mixed" if some keys fit only murmur2 and others only
    CRC32 (producers with different partitioners); "unknown" while no key tells the two apart.
    """
    if evidence.neither:
        return "unexplained"
    if evidence.murmur2 and evidence.consistent_random:
        return "mixed"
    if evidence.murmur2:
        return "murmur2"
    if evidence.consistent_random:
        return "consistent_random"
    return "unknown"


def resolve(partitioner: Partitioner, evidence: PartitionerEvidence) -> Detection:
    """Return the partitioner to route by: an explicit setting wins; "auto" detects from the evidence."""
    return detect(evidence) if partitioner == "auto" else partitioner


def candidates_many(keys: Sequence[bytes], partitions: int, detected: str) -> list[tuple[int, ...] | None]:
    """Return candidate_partitions of each key (serialized), hashing the batch at once."""
    if detected == "unexplained":
        return [None] * len(keys)
    if detected not in (*PARTITIONERS, "mixed", "unknown"):
        raise ValueError(f"not a partitioner or a detection: {detected!r}")
    murmur = [(h & 0x7FFFFFFF) % partitions for h in murmur2_many(keys)] if detected != "consistent_random" else []
    crc = [zlib.crc32(key) % partitions for key in keys] if detected != "murmur2" else []
    if detected == "murmur2":
        return [(p,) for p in murmur]
    if detected == "consistent_random":
        return [(p,) for p in crc]
    return [(a,) if a == b else (a, b) for a, b in zip(murmur, crc, strict=True)]


def candidate_partitions(key: bytes, partitions: int, detected: str) -> tuple[int, ...] | None:
    """Return the partitions key (serialized) may live in, murmur2's first; None when routing cannot tell.

    detected is a Detection (an explicit partitioner name counts as detected). "mixed" and "unknown" give
    both hashes' partitions (one when they agree): reading both is right whichever producer wrote the key.
    """
    if detected == "unexplained":
        return None
    if detected in PARTITIONERS:
        return (PARTITIONERS[detected](key, partitions),)
    if detected not in ("mixed", "unknown"):
        raise ValueError(f"not a partitioner or a detection: {detected!r}")
    where = placement(key, partitions)
    return (where.murmur2,) if where.murmur2 == where.consistent_random else tuple(where)
