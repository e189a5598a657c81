"""Partition databases (RocksDB) and the key-value, window and bloom store views over them.

Layers, from the bottom: StateDirectory → PartitionDB (one RocksDB per topic-partition, offsets) →
PartitionTransaction (one atomic batch) → store views (KeyValueStore, WindowStore, BloomStore).
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
from iqgraph.stores.kv import KeyValueStore
from iqgraph.stores.partition import PartitionDB, PartitionState, PartitionTransaction
from iqgraph.stores.ranking import KEEP_GROUP, IndexEntry, RankingStore
from iqgraph.stores.scan import Page
from iqgraph.stores.spec import BloomSpec, StoreKind, StoreSpec, WindowSpec
from iqgraph.stores.state_dir import PartitionStores, StateDirectory, StoreView
from iqgraph.stores.window import WindowedValue, WindowStore

__all__ = [
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
    "OffsetError",
    "OffsetGapError",
    "RepartitionedError",
    "Page",
    "PartitionDB",
    "PartitionState",
    "PartitionStores",
    "PartitionTransaction",
    "RankingStore",
    "StateDirError",
    "StateDirLockedError",
    "StateDirectory",
    "StoreError",
    "StoreKind",
    "StoreMigratedError",
    "StoreNotReadyError",
    "StoreSpec",
    "StoreView",
    "UnknownFormatError",
    "UnknownStoreError",
    "UserError",
    "ValueFormatError",
    "WindowSpec",
    "WindowStore",
    "WindowedValue",
    "aggregation_named",
    "decode_value",
    "encode_value",
]
