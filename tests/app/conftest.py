"""Fixtures shared by tests/app: every shipped example filled once per session (``tests.support.filled_examples``)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from pyspark.sql import SparkSession

from tests.support.filled_examples import EXAMPLES, Example


@pytest.fixture(scope="session", params=EXAMPLES)
def filled_example(
    request: pytest.FixtureRequest, spark: SparkSession, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Example]:
    """One shipped example's stores filled from its generator (read-only: tests must not write to them)."""
    module = __import__(f"iqgraph.examples.{request.param}", fromlist=["app"])
    found = Example(module.app, spark, tmp_path_factory.mktemp(request.param))
    yield found
    found.close()
