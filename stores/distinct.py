"""How many distinct keys several partitions hold together, for a store keyed by a column.

Such a store holds a key in every partition whose records had it (a genre in each partition with a loan of
that genre), so adding the partitions' counts counts a key once per partition. Each partition gives instead
what the union needs:

- key-value and window stores: ``KeyDigests``, the 16-byte BLAKE2b digests of its encoded keys (a window store's
  keys are (key, window start)); the union of the sets is counted — exact (two different keys share a digest
  with a probability of about n² / 2¹²⁹);
- bloom stores: ``BloomBits``, a snapshot of its filter; the filters are OR-ed stage by stage (every partition's
  filter has the same parameters) and the union's size estimated from the bits set, as a Bloom filter's
  cardinality is (Swamidass & Baldi): -m/k · ln(1 - X/m) per stage.
"""

from __future__ import annotations

import hashlib
import io
import math
from collections.abc import Iterable
from typing import NamedTuple

from pybloom_live import ScalableBloomFilter

DIGEST_BYTES = 16


class KeyDigests(NamedTuple):
    """The digests of one partition's keys, concatenated (DIGEST_BYTES each)."""

    data: bytes


class BloomBits(NamedTuple):
    """One partition's bloom filter, as ``ScalableBloomFilter.tofile`` writes it."""

    data: bytes


Distinct = KeyDigests | BloomBits


def key_digests(keys: Iterable[bytes]) -> KeyDigests:
    """Return the digests of encoded keys."""
    return KeyDigests(b"".join(hashlib.blake2b(key, digest_size=DIGEST_BYTES).digest() for key in keys))


def distinct_count(parts: Iterable[Distinct]) -> int:
    """Return how many distinct keys the partitions' parts hold together (all of one kind)."""
    found = list(parts)
    if all(isinstance(p, KeyDigests) for p in found):
        seen: set[bytes] = set()
        for part in found:
            data = part.data
            seen.update(data[i : i + DIGEST_BYTES] for i in range(0, len(data), DIGEST_BYTES))
        return len(seen)
    if all(isinstance(p, BloomBits) for p in found):
        return _bloom_union_estimate([ScalableBloomFilter.fromfile(io.BytesIO(p.data)) for p in found])
    raise ValueError("the partitions of one store gave different kinds of key sets")


def _bloom_union_estimate(filters: list[ScalableBloomFilter]) -> int:
    stages: dict[int, object] = {}
    for bloom in filters:
        for i, stage in enumerate(bloom.filters):
            stages[i] = stage.bitarray if i not in stages else stages[i] | stage.bitarray
    total = 0.0
    for i, bits in stages.items():
        stage = next(b.filters[i] for b in filters if len(b.filters) > i)
        m, k, x = stage.num_bits, stage.num_slices, bits.count(True)  # type: ignore[attr-defined]
        total += m if x >= m else -(m / k) * math.log(1 - x / m)
    return round(total)
