"""What the stores package needs to know about a store: its kind, key type, aggregation, windows."""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass, field

from iqgraph.stores.aggregations import LATEST, Aggregation
from iqgraph.stores.codecs import KeyType

DEFAULT_RETENTION_MS = 24 * 3600 * 1000
_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_]*$")


class StoreKind(enum.Enum):
    """The kinds of state store."""

    KEY_VALUE = "key_value"
    WINDOW = "window"
    BLOOM = "bloom"
    #: A ranked index over another key-value store of the same partition: its members by value, per group.
    RANKING = "ranking"


@dataclass(frozen=True)
class WindowSpec:
    """Tumbling (advance = size) or hopping windows, with grace for late records and a retention."""

    size_ms: int
    advance_ms: int | None = None
    grace_ms: int = 0
    retention_ms: int | None = None

    def __post_init__(self) -> None:
        if self.size_ms <= 0:
            raise ValueError(f"window size must be positive, got {self.size_ms} ms")
        if not 0 < self.advance <= self.size_ms:
            raise ValueError(f"window advance must be in (0, size]; got {self.advance} ms for size {self.size_ms}")
        if self.grace_ms < 0:
            raise ValueError(f"grace must not be negative, got {self.grace_ms} ms")
        if self.retention < self.size_ms + self.grace_ms:
            raise ValueError("retention must be at least window size + grace")

    @property
    def advance(self) -> int:
        """Return the hop between window starts (the size for tumbling windows)."""
        return self.advance_ms or self.size_ms

    @property
    def retention(self) -> int:
        """Return how long a window is kept after its start (default, as Kafka Streams: 1 day or more)."""
        if self.retention_ms is not None:
            return self.retention_ms
        return max(DEFAULT_RETENTION_MS, self.size_ms + self.grace_ms)

    def window_starts(self, timestamp_ms: int) -> list[int]:
        """Return the starts of every window that contains timestamp_ms, oldest first."""
        advance = self.advance
        last = timestamp_ms - timestamp_ms % advance
        first = -(-(timestamp_ms - self.size_ms + 1) // advance) * advance
        return list(range(first, last + 1, advance))


@dataclass(frozen=True)
class BloomSpec:
    """A scalable bloom filter's initial capacity and false-positive rate."""

    capacity: int = 100_000
    error_rate: float = 0.001

    def __post_init__(self) -> None:
        if self.capacity <= 0 or not 0 < self.error_rate < 1:
            raise ValueError("bloom capacity must be positive and error rate in (0, 1)")


def positions_family(store: str) -> str:
    """Return the column family of store's key positions (``stores.positions``)."""
    return f"{store}.positions"


@dataclass(frozen=True)
class StoreSpec:
    """One store: its name (a column family in every partition database) and how it is kept."""

    name: str
    kind: StoreKind
    key_type: KeyType = "string"
    aggregation: Aggregation = LATEST
    window: WindowSpec | None = None
    bloom: BloomSpec | None = field(default=None)

    def __post_init__(self) -> None:
        if not _NAME.match(self.name):
            raise ValueError(f"store name {self.name!r} must be a letter then letters, digits or '_'")
        if (self.kind is StoreKind.WINDOW) != (self.window is not None):
            raise ValueError(f"store {self.name!r}: a window spec goes with, and only with, a window store")
        if self.kind is StoreKind.BLOOM and self.bloom is None:
            object.__setattr__(self, "bloom", BloomSpec())

    @property
    def column_families(self) -> tuple[str, ...]:
        """Return the column families this store owns in a partition database."""
        if self.kind is StoreKind.WINDOW:
            return (self.name, f"{self.name}.by_time", positions_family(self.name))
        if self.kind is StoreKind.RANKING:
            return (self.name, f"{self.name}.index")
        if self.kind is StoreKind.KEY_VALUE:
            return (self.name, positions_family(self.name))
        return (self.name,)
