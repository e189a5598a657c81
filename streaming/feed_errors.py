"""The change feed's errors: one root, ``ChangeFeedError``, whose docstring draws the tree."""

from __future__ import annotations


class ChangeFeedError(Exception):
    """Root of the change feed's errors.

    ChangeFeedError
    ├── TooManySubscriptionsError   the feed already has max_subscriptions
    ├── SubscriptionOverflowError   the subscriber fell too far behind: re-read the store, then go on
    ├── SubscriptionClosedError     the subscription was closed and everything before was read
    └── SnapshotRaceError           batches kept committing while a snapshot was read: try again
    """


class TooManySubscriptionsError(ChangeFeedError):
    """The feed already has as many subscriptions as it allows."""


class SubscriptionOverflowError(ChangeFeedError):
    """The subscription's buffer overflowed and was dropped: re-read the store (read_then_follow)."""


class SubscriptionClosedError(ChangeFeedError):
    """The subscription is closed and drained."""


class SnapshotRaceError(ChangeFeedError):
    """A partition kept applying batches while its snapshot was read."""
