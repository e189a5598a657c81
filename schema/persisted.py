"""Documents known by their SHA-256: trusted documents from a manifest, and Automatic Persisted Queries (APQ).

A request may name its document instead of sending it (``resolve``, on every transport: POST, GET, SSE and
graphql-transport-ws):

- ``documentId`` (the GraphQL over HTTP persisted-documents appendix draft: ``"sha256:<hex>"``, or the bare
  hex GraphQL Code Generator's client preset sends) names a trusted document;
- ``extensions.persistedQuery = {"version": 1, "sha256Hash": <hex>}`` (Apollo Client's persisted-queries
  link) names a trusted document, or one an earlier request registered: sent with its ``query``, the hash is
  checked against the text and the document kept (a bounded cache, most recently used first); sent without, an
  unknown hash is ``PERSISTED_QUERY_NOT_FOUND`` and the client sends it again with the document.

Trusted documents come from a manifest (``load_manifest``) in the JSON formats clients' tools write: a flat
``{"<sha256>": "<document>"}`` object (GraphQL Code Generator's ``persisted-documents.json``, Relay's persisted
queries) or Apollo's persisted query manifest (``{"format": "apollo-persisted-query-manifest", "operations":
[{"id", "body", …}]}``). Each key must be its document's SHA-256 (a manifest whose key is not is refused, naming
it); the node validates each document against its schema at start (``PersistedDocuments.check``: a document that
does not validate is a start-up error naming it) and compiles its plan once, kept for the node's life.

With ``only_trusted`` (the production lock-down) a request runs only a trusted document — by id, by hash, or by
its full text when that text is one of them; anything else is ``TRUSTED_DOCUMENT_REQUIRED``, and APQ registers
nothing. Errors are ``http_spec.RequestError`` refusals with a GraphQL body and a code.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable, Mapping
from pathlib import Path

from iqgraph.schema.errors import BAD_REQUEST, PERSISTED_QUERY_NOT_FOUND, TRUSTED_DOCUMENT_REQUIRED
from iqgraph.schema.http_spec import RequestError
from iqgraph.schema.limits import DocumentCache

#: Documents APQ keeps at most, and their characters together.
APQ_ENTRIES, APQ_CHARS = 10_000, 16 << 20
_HEX = re.compile(r"[0-9a-f]{64}")


class ManifestError(ValueError):
    """A trusted documents manifest that cannot be used; the message names the file and the document."""


def sha256_of(document: str) -> str:
    """Return the lower-case hex SHA-256 of a document's UTF-8 text (what clients hash)."""
    return hashlib.sha256(document.encode("utf-8")).hexdigest()


def load_manifest(path: Path) -> dict[str, str]:
    """Return the documents of a manifest file by their SHA-256; ManifestError saying what to fix."""
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ManifestError(f"cannot read the trusted documents manifest {path}: {exc.strerror}") from None
    except ValueError as exc:
        raise ManifestError(f"the trusted documents manifest {path} is not JSON: {exc}") from None
    if isinstance(raw, dict) and raw.get("format") == "apollo-persisted-query-manifest":
        operations = raw.get("operations")
        if not isinstance(operations, list):
            raise ManifestError(f"{path}: an Apollo persisted query manifest needs a list of operations")
        entries = [(op.get("id"), op.get("body")) if isinstance(op, dict) else (None, None) for op in operations]
    elif isinstance(raw, dict):
        entries = list(raw.items())
    else:
        raise ManifestError(f"{path}: a manifest is a JSON object of documents by their SHA-256")
    documents: dict[str, str] = {}
    for key, document in entries:
        if not isinstance(key, str) or not isinstance(document, str):
            raise ManifestError(f"{path}: entry {key!r} is not a SHA-256 and a document (both strings)")
        digest = key.removeprefix("sha256:").lower()
        if not _HEX.fullmatch(digest):
            raise ManifestError(f"{path}: {key!r} is not a SHA-256 (64 hex digits): hash documents with sha256")
        if sha256_of(document) != digest:
            raise ManifestError(f"{path}: the document under {key} is not the one that hashes to it")
        documents[digest] = document
    return documents


class PersistedDocuments:
    """The trusted documents of a node and its APQ cache; ``resolve`` turns a request naming a document into one
    carrying it."""

    def __init__(self, trusted: Mapping[str, str] | None = None, only_trusted: bool = False) -> None:
        self.trusted = dict(trusted or {})
        self.only_trusted = only_trusted
        self._registered: DocumentCache[str] = DocumentCache(APQ_ENTRIES, APQ_CHARS, APQ_CHARS)

    def check(self, validate: Callable[[str], list[str]], compile_plan: Callable[[str], object]) -> None:
        """Validate every trusted document (validate returns its errors' messages) and compile its plan;
        ManifestError naming the first that does not validate."""
        for digest, document in self.trusted.items():
            errors = validate(document)
            if errors:
                raise ManifestError(f"trusted document sha256:{digest} does not validate: {'; '.join(errors)}")
            compile_plan(document)

    def resolve(self, request: object) -> object:
        """Return request (a GraphQL-over-HTTP request's JSON, or a subscribe payload) with the document it names
        as its ``query``; request unchanged when it names none (and may run). RequestError when it may not."""
        if not isinstance(request, dict):
            return request
        query = request.get("query")
        extensions = request.get("extensions")
        persisted = extensions.get("persistedQuery") if isinstance(extensions, dict) else None
        document_id = request.get("documentId")
        if document_id is not None:
            if not isinstance(document_id, str):
                raise RequestError(422, "documentId must be a string: sha256:<hex of the document's SHA-256>")
            digest = document_id.removeprefix("sha256:").lower()
        elif persisted is not None:
            digest = self._digest(persisted)
        else:
            if self.only_trusted and isinstance(query, str):
                self._allowed(sha256_of(query))
            return request
        if isinstance(query, str) and query:  # sent with its document: the hash must be the document's
            if sha256_of(query) != digest:
                raise RequestError(400, "the document's SHA-256 is not the one the request names", BAD_REQUEST)
            self._allowed(digest)
            if persisted is not None and digest not in self.trusted:
                self._registered.get(digest, len(query), lambda: query)  # APQ: later requests send the hash only
            return request
        return {**request, "query": self._trusted(digest) if document_id is not None else self._known(digest)}

    def _digest(self, persisted: object) -> str:
        if not isinstance(persisted, dict) or persisted.get("version") != 1:
            raise RequestError(400, "extensions.persistedQuery must be {version: 1, sha256Hash}", BAD_REQUEST)
        digest = persisted.get("sha256Hash")
        if not isinstance(digest, str) or not _HEX.fullmatch(digest.lower()):
            raise RequestError(400, "extensions.persistedQuery.sha256Hash must be 64 hex digits", BAD_REQUEST)
        return digest.lower()

    def _trusted(self, digest: str) -> str:
        document = self.trusted.get(digest)
        if document is None:
            raise RequestError(400, f"no trusted document sha256:{digest}", PERSISTED_QUERY_NOT_FOUND)
        return document

    def _known(self, digest: str) -> str:
        document = self.trusted.get(digest)
        if document is None and not self.only_trusted:
            document = self._registered.find(digest)
        if document is None:
            raise RequestError(400, "PersistedQueryNotFound", PERSISTED_QUERY_NOT_FOUND)
        return document

    def _allowed(self, digest: str) -> None:
        if self.only_trusted and digest not in self.trusted:
            raise RequestError(
                400, "this node runs trusted documents only: send one by its documentId", TRUSTED_DOCUMENT_REQUIRED
            )


def describe(documents: PersistedDocuments) -> str:
    """Return one line saying which documents a node runs."""
    trusted = f"{len(documents.trusted)} trusted documents"
    if documents.only_trusted:
        return f"{trusted}; only those run"
    return f"{trusted}; automatic persisted queries on" if documents.trusted else "automatic persisted queries on"
