"""ship_module: the user's package or module goes to the executors; what is installed does not."""

from __future__ import annotations

import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from iqgraph.streaming.session import ship_module


class Context:
    def __init__(self) -> None:
        self.files: list[str] = []

    def addPyFile(self, path: str) -> None:  # noqa: N802 - SparkContext's name
        self.files.append(path)


class Session:
    def __init__(self) -> None:
        self.sparkContext = Context()  # noqa: N815 - SparkSession's name


@pytest.fixture
def user_code(tmp_path: Path) -> Iterator[Path]:
    (tmp_path / "shopapp" / "logic").mkdir(parents=True)
    (tmp_path / "shopapp" / "__init__.py").write_text("")
    (tmp_path / "shopapp" / "logic" / "__init__.py").write_text("")
    (tmp_path / "shopapp" / "logic" / "bands.py").write_text("def band(x):\n    return x\n")
    (tmp_path / "single.py").write_text("app = None\n")
    sys.path.insert(0, str(tmp_path))
    yield tmp_path
    sys.path.remove(str(tmp_path))
    for name in [m for m in sys.modules if m.split(".")[0] in ("shopapp", "single")]:
        del sys.modules[name]


def test_a_users_package_is_shipped_zipped_from_its_top_level(user_code: Path) -> None:
    spark: Any = Session()
    shipped = ship_module(spark, "shopapp.logic.bands")
    assert shipped is not None and spark.sparkContext.files == [str(shipped)]
    assert set(zipfile.ZipFile(shipped).namelist()) >= {"shopapp/__init__.py", "shopapp/logic/bands.py"}


def test_a_users_single_module_is_shipped_as_its_file(user_code: Path) -> None:
    spark: Any = Session()
    assert ship_module(spark, "single") == (user_code / "single.py").resolve()


@pytest.mark.parametrize("installed", ["json", "httpx", "iqgraph.examples.shop", "no_such_module_anywhere"])
def test_what_is_installed_or_missing_is_not_shipped(installed: str) -> None:
    spark: Any = Session()
    assert ship_module(spark, installed) is None and spark.sparkContext.files == []
