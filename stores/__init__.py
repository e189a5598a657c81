"""Partition databases (RocksDB) and the key-value, window and bloom store views over them.

Layers, from the bottom: StateDirectory → PartitionDB (one RocksDB per topic-partition, offsets) →
PartitionTransaction (one atomic batch) → store views (KeyValueStore, WindowStore, BloomStore).
"""

from stores.aggregations import AGGREGATIONS, AVG, COUNT, LATEST, MAX, MIN, SUM, Aggregation, aggregation_named
from stores.bloom import BloomStore
from stores.codecs import Key, KeyCodec, KeyType, decode_value, encode_value
from stores.exceptions import (
    CorruptValueError,
    InvalidCursorError,
    InvalidKeyError,
    OffsetError,
    OffsetGapError,
    StateDirError,
    StateDirLockedError,
    StoreError,
    StoreMigratedError,
    StoreNotReadyError,
    UnknownFormatError,
    UnknownStoreError,
    ValueFormatError,
)
from stores.kv import KeyValueStore
from stores.partition import PartitionDB, PartitionState, PartitionTransaction
from stores.scan import Page
from stores.spec import BloomSpec, StoreKind, StoreSpec, WindowSpec
from stores.state_dir import PartitionStores, StateDirectory, StoreView
from stores.window import WindowedValue, WindowStore

__all__ = [
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
    "InvalidCursorError",
    "InvalidKeyError",
    "Key",
    "KeyCodec",
    "KeyType",
    "KeyValueStore",
    "OffsetError",
    "OffsetGapError",
    "Page",
    "PartitionDB",
    "PartitionState",
    "PartitionStores",
    "PartitionTransaction",
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
    "ValueFormatError",
    "WindowSpec",
    "WindowStore",
    "WindowedValue",
    "aggregation_named",
    "decode_value",
    "encode_value",
]
