"""Who is asking, and which stores they may read: the Principal every request carries.

A node authenticates a client (``app.security.auth``: a JWT or an API key) or a peer (``app.security.peer_auth``:
the peer signs the caller's principal into its sub-request), and binds the resulting Principal to the request's
queries. Every store read is checked against it with ``check_read`` — on the node the client asked and again on the
owner a key is forwarded to — so a field on a store the caller may not read fails with FORBIDDEN, for that field
only.

Grants are the caller's scopes: ``read:<store>`` lets it read one store, ``read:*`` every store.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from iqgraph.schema.errors import FORBIDDEN, ApiError

#: The scope that grants reading every store.
READ_ALL = "read:*"
_READ = "read:"


@dataclass(frozen=True)
class Principal:
    """A caller: its subject (for logs) and the stores it may read (None: every store)."""

    subject: str
    stores: frozenset[str] | None = None

    @classmethod
    def from_scopes(cls, subject: str, scopes: Iterable[str]) -> Principal:
        """Return the principal the scopes grant (``read:<store>``, ``read:*``; others are ignored)."""
        granted = [s for s in scopes if s.startswith(_READ)]
        if READ_ALL in granted:
            return cls(subject, None)
        return cls(subject, frozenset(s[len(_READ) :] for s in granted))

    def may_read(self, store: str) -> bool:
        """Return whether this caller may read store."""
        return self.stores is None or store in self.stores

    def to_json(self) -> dict[str, Any]:
        """Return the principal as a peer carries it (``app.security.peer_auth`` signs it)."""
        return {"sub": self.subject, "stores": None if self.stores is None else sorted(self.stores)}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Principal:
        """Return the principal a peer carried; raise ValueError if it is not one."""
        subject, stores = data.get("sub"), data.get("stores")
        if not isinstance(subject, str) or not (stores is None or isinstance(stores, list)):
            raise ValueError("not a principal")
        if stores is not None and not all(isinstance(s, str) for s in stores):
            raise ValueError("not a principal")
        return cls(subject, None if stores is None else frozenset(stores))


#: The caller when authentication is off: anyone may read every store.
ANONYMOUS = Principal("anonymous", None)
#: Where the authenticated caller of a request is put in its ASGI scope (app.security.gate, app.security.peer_auth).
PRINCIPAL_SCOPE_KEY = "iqgraph.principal"


def principal_of(scope: Mapping[str, Any]) -> Principal:
    """Return the caller an ASGI scope was authenticated as (ANONYMOUS if nothing authenticated it)."""
    found = scope.get(PRINCIPAL_SCOPE_KEY)
    return found if isinstance(found, Principal) else ANONYMOUS


def check_read(principal: Principal, store: str) -> None:
    """Raise FORBIDDEN unless principal may read store (the one rule of store authorization)."""
    if not principal.may_read(store):
        raise ApiError(f"not allowed to read store {store!r}", FORBIDDEN, store=store)
