"""Exceptions of the stores package, and the root of every error a user can fix at start.

``UserError`` is defined here, at the bottom of the packages, so that every layer's start errors can subclass it
(``DefinitionError``, ``SettingsError``, ``NodeStartError``, …, and ``StateDirError`` below); it is exported as
``iqgraph.UserError``, and the command line turns any of them into one line on stderr.

The stores' own tree hangs off one root, so callers can catch every expected store failure at once::

    StoreError
    ├── UnknownStoreError          no store of that name in the partition database
    ├── StoreNotReadyError         the partition is not queryable (created, restoring, closed)
    │   ├── StoreMigratedError         the partition is not hosted here (moved to another node)
    │   ├── DataLostError              records it never applied were deleted from Kafka (retention)
    │   └── RepartitionedError         its topic's partition count changed: keys moved between partitions
    ├── InvalidKeyError            a key of the wrong type or out of range for the store's key codec
    ├── ValueFormatError           a stored value that cannot be decoded
    │   ├── CorruptValueError          the bytes are not a value of the known format
    │   └── UnknownFormatError         a format version this code does not know (written by a newer one)
    ├── OffsetError                a batch that does not follow the stored offsets
    │   └── OffsetGapError             it would skip records (its start is past the next offset)
    ├── StateDirError              a state directory that is not ours, or unusable (also a UserError)
    │   └── StateDirLockedError        the directory is held by another process (or handle)
    └── InvalidCursorError         a pagination cursor that this store did not issue
"""

from __future__ import annotations


class UserError(Exception):
    """Root of every error a user can fix at start (the app, its settings, the broker, the state directory).

    Its message says what to fix, in one line: the command line prints it as is, never a traceback.
    """


class StoreError(Exception):
    """Root of every expected failure in the stores package."""


class UnknownStoreError(StoreError):
    """No store of that name exists."""


class StoreNotReadyError(StoreError):
    """The partition that holds the key is not queryable right now."""

    def __init__(self, message: str, *, state: str, retry_after_ms: int = 1000) -> None:
        super().__init__(message)
        self.state = state
        self.retry_after_ms = retry_after_ms


class StoreMigratedError(StoreNotReadyError):
    """The partition that holds the key is not hosted by this node (it moved, or was never here)."""

    def __init__(self, message: str, *, retry_after_ms: int = 1000) -> None:
        super().__init__(message, state="MIGRATED", retry_after_ms=retry_after_ms)


class DataLostError(StoreNotReadyError):
    """Kafka deleted records of the partition that its stores never applied: they can never be complete again.

    Records [first_offset, end_offset) are gone (retention, or ``kafka-delete-records``) while the stores had
    applied up to first_offset. Serving what they hold would be silently wrong forever; the recovery is to
    rebuild the partition from the topic's earliest offset (``iqgraph serve --rebuild-lost-partitions``).
    """

    def __init__(self, message: str, *, topic: str, partition: int, first_offset: int, end_offset: int) -> None:
        super().__init__(message, state="DATA_LOST")
        self.topic = topic
        self.partition = partition
        self.first_offset = first_offset
        self.end_offset = end_offset


class RepartitionedError(StoreNotReadyError):
    """The partition's topic has another partition count than the one its stores were built for.

    A record's partition is its key's hash modulo the count: once it changes, a key's records are split between
    two partitions, and no per-key answer from these stores can be right again (Kafka cannot re-split a topic).
    """

    def __init__(self, message: str, *, topic: str, built_for: int, found: int) -> None:
        super().__init__(message, state="REPARTITIONED")
        self.topic = topic
        self.built_for = built_for
        self.found = found


class InvalidKeyError(StoreError):
    """A key that the store's key codec cannot encode."""


class ValueFormatError(StoreError):
    """A stored value that cannot be decoded."""


class CorruptValueError(ValueFormatError):
    """The stored bytes are not a value of the format their header names."""


class UnknownFormatError(ValueFormatError):
    """The stored value has a format version this code does not know."""


class OffsetError(StoreError):
    """A batch that does not follow the offsets stored in the partition database."""


class OffsetGapError(OffsetError):
    """A batch whose start offset is past the next offset to apply: applying it would lose records."""


class StateDirError(StoreError, UserError):
    """A state directory that is not ours or cannot be used."""


class StateDirLockedError(StateDirError):
    """A partition database that another process (or a live handle) holds open."""


class InvalidCursorError(StoreError):
    """A pagination cursor that is malformed or belongs to another query."""
