"""docker-compose.yml and the check of a compose file against the compose specification (check-jsonschema's vendored
compose-spec schema; no Docker engine runs here)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "docker-compose.yml"


def check_jsonschema(path: Path) -> subprocess.CompletedProcess[str]:
    tool = shutil.which("check-jsonschema", path=str(Path(sys.executable).parent))
    assert tool is not None, "check-jsonschema is a test dependency: pip install -e '.[test]'"
    command = [tool, "--builtin-schema", "vendor.compose-spec", str(path)]
    return subprocess.run(command, capture_output=True, text=True, timeout=60)
