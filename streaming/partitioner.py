"""The producers' partitioner: which partition a key's records go to (invariant 4).

murmur2 is the Kafka Java client's default (librdkafka's ``murmur2_random`` for keyed records);
``consistent_random`` is librdkafka's CRC32 partitioner. Keys are hashed in their serialized form:
UTF-8 for string keys, 8-byte big-endian for long keys (Kafka's LongSerializer).
"""

from __future__ import annotations

import functools
import zlib
from collections.abc import Callable

from iqgraph.streaming.definitions import KeyFormat, Partitioner

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
    return PARTITIONERS[partitioner](serialize_key(key, key_format), partitions)
