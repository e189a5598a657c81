"""Partition databases (RocksDB) and the key-value, window, bloom and ranking store views over them.

Layers, from the bottom: StateDirectory → PartitionDB (one RocksDB per topic-partition, offsets) →
PartitionTransaction (one atomic batch) → store views (KeyValueStore, WindowStore, BloomStore, RankingStore),
each kind a class answering one read protocol (``StoreReads``: states, a page of a typed scan, a count).
"""

from iqgraph.stores.aggregations import AGGREGATIONS, AVG, COUNT, LATEST, MAX, MIN, SUM, Aggregation, aggregation_named
from iqgraph.stores.bloom import BloomStore
from iqgraph.stores.codecs import Key, KeyCodec, KeyType, decode_value, encode_value
from iqgraph.stores.exceptions import (
    CorruptValueError,
    DataLostError,
    InvalidCursorError,
    InvalidKeyError,
    OffsetError,
    OffsetGapError,
    RepartitionedError,
    StateDirError,
    StateDirLockedError,
    StoreError,
    StoreMigratedError,
    StoreNotReadyError,
    UnknownFormatError,
    UnknownStoreError,
    UserError,
    ValueFormatError,
)
from iqgraph.stores.kinds import store_class
from iqgraph.stores.kv import KeyValueStore
from iqgraph.stores.partition import PartitionDB, PartitionState, PartitionTransaction
from iqgraph.stores.ranking import KEEP_GROUP, IndexEntry, RankingStore
from iqgraph.stores.scan import Page
from iqgraph.stores.scans import (
    FAR_FUTURE,
    FAR_PAST,
    PrefixScan,
    RangeScan,
    Scan,
    TopScan,
    WindowRangeScan,
    WindowScan,
    scan_from_wire,
)
from iqgraph.stores.spec import BloomSpec, StoreKind, StoreSpec, WindowSpec
from iqgraph.stores.state_dir import PartitionStores, StateDirectory, StoreView
from iqgraph.stores.types import Lookup, StoreReads
from iqgraph.stores.window import WindowedValue, WindowStore

__all__ = [
    "FAR_FUTURE",
    "FAR_PAST",
    "KEEP_GROUP",
    "AGGREGATIONS",
    "AVG",
    "COUNT",
    "LATEST",
    "MAX",
    "MIN",
    "SUM",
    "Aggregation",
    "BloomSpec",
    "BloomStore",
    "CorruptValueError",
    "DataLostError",
    "IndexEntry",
    "InvalidCursorError",
    "InvalidKeyError",
    "Key",
    "KeyCodec",
    "KeyType",
    "KeyValueStore",
    "Lookup",
    "OffsetError",
    "OffsetGapError",
    "RepartitionedError",
    "Page",
    "PartitionDB",
    "PartitionState",
    "PartitionStores",
    "PartitionTransaction",
    "PrefixScan",
    "RangeScan",
    "RankingStore",
    "Scan",
    "StateDirError",
    "StateDirLockedError",
    "StateDirectory",
    "StoreError",
    "StoreKind",
    "StoreMigratedError",
    "StoreNotReadyError",
    "StoreReads",
    "StoreSpec",
    "StoreView",
    "TopScan",
    "UnknownFormatError",
    "UnknownStoreError",
    "UserError",
    "ValueFormatError",
    "WindowSpec",
    "WindowRangeScan",
    "WindowScan",
    "WindowStore",
    "WindowedValue",
    "aggregation_named",
    "decode_value",
    "encode_value",
    "scan_from_wire",
    "store_class",
]
