"""Store kinds as objects: the view class of each ``StoreKind``, which the query path asks instead of switching.

Each class answers the read protocol (``stores.types.StoreReads``): its instances read one partition's store,
the class says how its states combine over partitions and become values.
"""

from __future__ import annotations

from iqgraph.stores.bloom import BloomStore
from iqgraph.stores.kv import KeyValueStore
from iqgraph.stores.ranking import RankingStore
from iqgraph.stores.spec import StoreKind
from iqgraph.stores.window import WindowStore

StoreView = KeyValueStore | WindowStore | BloomStore | RankingStore
#: The view class of each kind of store.
STORE_CLASSES: dict[StoreKind, type[StoreView]] = {
    cls.kind: cls for cls in (KeyValueStore, WindowStore, BloomStore, RankingStore)
}


def store_class(kind: StoreKind) -> type[StoreView]:
    """Return the view class of a kind of store."""
    return STORE_CLASSES[kind]
