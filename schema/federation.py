"""A federation v2 subgraph (``IQGRAPH_FEDERATION=true``): iqgraph's entities in an organisation's supergraph.

Each entity type (schema.entities) carries ``@key(fields: "key")``; Strawberry's federation schema adds the
subgraph's ``@link`` to the federation spec, ``_service { sdl }`` and ``_entities(representations:)``. The
router's ``_entities`` call is answered the way ``customerList(keys:)`` is: the representations of one type
become the entities of ONE batch, so each store a selection needs is read once for all of them — through the
request's loaders, routed by key, one sub-request per peer — never once per representation (Strawberry's own
resolver calls ``resolve_reference`` per representation). A representation whose key no store could hold, or
whose type is no entity here, is that entity's error only.
"""

from __future__ import annotations

from typing import Any

import strawberry
from strawberry.federation import Schema as StrawberryFederationSchema
from strawberry.federation.schema import FederationAny
from strawberry.types.info import Info

from iqgraph.schema.builder import IqGraphSchema
from iqgraph.schema.entities.batches import EntityBatch, EntityRef
from iqgraph.schema.errors import INVALID_ARGUMENT, ApiError, api_error
from iqgraph.stores import StoreError


class _Entity(EntityRef):
    """An entity of ``_entities``: an EntityRef that can carry the type it is cast to (the union's member)."""


class FederatedSchema(IqGraphSchema, StrawberryFederationSchema):
    """IqGraphSchema as a federation v2 subgraph, its ``_entities`` read in batches."""

    def entities_resolver(  # the annotations are Strawberry's: it makes the _entities field of them
        self, info: Info, representations: list[FederationAny]
    ) -> list[FederationAny]:
        """Return the entity of each representation, those of one type in one batch (see the module)."""
        batches: dict[str, EntityBatch] = {}
        found: list[Any] = []
        for representation in representations:
            given: Any = representation
            name = given.get("__typename") if isinstance(given, dict) else None
            type_ = self.schema_converter.type_map.get(name) if isinstance(name, str) else None
            origin = getattr(getattr(type_, "definition", None), "origin", None)
            kind = getattr(origin, "iqgraph_key", None)
            if kind is None or origin is None or not isinstance(name, str):
                found.append(ApiError(f"{name!r} is not an entity of this subgraph", INVALID_ARGUMENT))
                continue
            try:
                key = kind.check(given.get("key"))
            except StoreError as exc:
                found.append(api_error(exc))
                continue
            batch = batches.setdefault(name, EntityBatch((), None, open_=True))
            found.append(strawberry.cast(origin, _Entity(key, batch.add(key), batch)))
        return found
