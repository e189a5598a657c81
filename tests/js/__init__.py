"""The JavaScript clients the tests run under node (package.json, installed by ``make test``: npm ci)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

NODE_DIR = Path(__file__).resolve().parent


def require_node() -> None:
    """Fail with what to run when node or the clients are missing (``make test`` installs them)."""
    if shutil.which("node") is None:
        pytest.fail("node is missing: apt-get install nodejs npm (make test needs it for the JS clients' tests)")
    if not (NODE_DIR / "node_modules" / ".package-lock.json").exists():
        pytest.fail(f"the JS clients are not installed: npm ci --prefix {NODE_DIR} (make test runs it)")
