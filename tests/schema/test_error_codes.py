"""Every error code has its properties in one table, and the table is consistent."""

from __future__ import annotations

import pytest

from iqgraph.schema import errors
from iqgraph.schema.errors import CODES, properties

ALL_CODES = sorted(
    value for name, value in vars(errors).items() if name.isupper() and isinstance(value, str) and value == name
)


def test_every_code_the_api_defines_is_in_the_table() -> None:
    assert ALL_CODES and set(ALL_CODES) == set(CODES)


@pytest.mark.parametrize("code", ALL_CODES)
def test_each_codes_properties_hang_together(code: str) -> None:
    found = properties(code)
    if found.waits:
        assert found.fails_over, "a code worth waiting for is a replica's trouble: it fails over"
    if found.fails_over:
        assert found.transient and found.http_status == 503
    assert found.client_error == (400 <= found.http_status < 500)
    assert 200 <= found.http_status < 600


def test_the_replica_codes_are_the_ones_that_fail_over() -> None:
    assert {c for c in CODES if CODES[c].fails_over} == {
        "NODE_UNAVAILABLE",
        "STORE_NOT_READY",
        "STORE_MIGRATED",
        "STALE_BEYOND_BOUND",
        "DATA_LOST",
    }
    assert {c for c in CODES if CODES[c].waits} == {"STORE_NOT_READY", "STORE_MIGRATED"}
    # a partition whose records Kafka deleted answers why, with what to do, not STORE_NOT_AVAILABLE
    assert {c for c in CODES if CODES[c].explains} == {"DATA_LOST"}


def test_an_unknown_code_is_an_internal_error() -> None:
    assert properties("NO_SUCH_CODE") == CODES["INTERNAL"] and CODES["INTERNAL"].http_status == 500
