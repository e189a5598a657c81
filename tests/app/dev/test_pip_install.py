"""app/dev/pip_install.py around a real pip, downloading from a package index on loopback."""

from __future__ import annotations

import functools
import http.server
import os
import pty
import re
import subprocess
import sys
import threading
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
SCRIPT = ROOT / "app" / "dev" / "pip_install.py"


def write_wheel(directory: Path, project: str, payload: int) -> None:
    """Write a wheel of project (version 1.0) carrying payload bytes that do not compress, and its index page."""
    dist = project.replace("-", "_")
    name = f"{dist}-1.0-py3-none-any.whl"
    files = {
        f"{dist}/__init__.py": b"",
        f"{dist}/payload.bin": os.urandom(payload),
        f"{dist}-1.0.dist-info/METADATA": f"Metadata-Version: 2.1\nName: {project}\nVersion: 1.0\n".encode(),
        f"{dist}-1.0.dist-info/WHEEL": b"Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = "".join(f"{path},,\n" for path in files) + f"{dist}-1.0.dist-info/RECORD,,\n"
    with zipfile.ZipFile(directory / "files" / name, "w", zipfile.ZIP_STORED) as wheel:
        for path, data in {**files, f"{dist}-1.0.dist-info/RECORD": record.encode()}.items():
            wheel.writestr(path, data)
    page = directory / "simple" / project
    page.mkdir(parents=True)
    (page / "index.html").write_text(f'<html><body><a href="../../files/{name}">{name}</a></body></html>')


@pytest.fixture
def index(tmp_path: Path) -> Iterator[str]:
    """Serve a simple index on loopback with big-demo (1.5 MB) and small-demo (20 kB); yield its URL."""
    root = tmp_path / "index"
    (root / "files").mkdir(parents=True)
    write_wheel(root, "big-demo", 1_500_000)
    write_wheel(root, "small-demo", 20_000)
    handler = functools.partial(QuietHandler, directory=str(root))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, name="index", daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/simple"
    finally:
        server.shutdown()
        thread.join(timeout=10)


class QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass


def pip_env(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    return env | {"PIP_CACHE_DIR": str(tmp_path / "cache"), "PIP_DISABLE_PIP_VERSION_CHECK": "1", "PIP_NO_INPUT": "1"}


def command(tmp_path: Path, index: str, *projects: str) -> list[str]:
    return [sys.executable, str(SCRIPT), "--index-url", index, "--target", str(tmp_path / "target"), *projects]


def pip_install(tmp_path: Path, index: str, *projects: str) -> subprocess.CompletedProcess[str]:
    run = command(tmp_path, index, *projects)
    return subprocess.run(run, capture_output=True, text=True, env=pip_env(tmp_path), timeout=120)


def test_a_line_per_large_download_the_small_ones_summed_and_the_time(tmp_path: Path, index: str) -> None:
    result = pip_install(tmp_path, index, "big-demo", "small-demo")

    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == "pip: downloading big_demo-1.0-py3-none-any.whl (1.5 MB)", lines
    assert re.fullmatch(r"pip: and 1 smaller download \(2\d\.\d kB\)", lines[1]), lines  # pip's rounding
    assert lines[2] == "pip: installing 2 packages", lines
    assert re.fullmatch(r"pip: done in [\d.]+ s: 2 packages installed; 2 downloads \(1\.5 MB\)", lines[-1]), lines
    assert len(lines) == 4 and all(line.startswith("pip: ") for line in lines), lines  # progress: terminals only
    assert (tmp_path / "target" / "big_demo" / "payload.bin").stat().st_size == 1_500_000


def test_a_failing_install_keeps_pips_error_and_exit_code(tmp_path: Path, index: str) -> None:
    result = pip_install(tmp_path, index, "no-such-demo")

    assert result.returncode == 1
    assert "No matching distribution found for no-such-demo" in result.stderr
    assert result.stdout.splitlines()[0].startswith("pip: failed (exit 1) after "), result.stdout


def test_on_a_terminal_the_progress_is_one_line_updated_in_place(tmp_path: Path, index: str) -> None:
    terminal, child = pty.openpty()
    with subprocess.Popen(command(tmp_path, index, "big-demo"), stdout=child, env=pip_env(tmp_path)) as pip:
        os.close(child)
        seen = b""
        while chunk := _read(terminal):
            seen += chunk
    os.close(terminal)

    assert pip.returncode == 0, seen
    assert b"\r\x1b[Kpip:   1.5 MB of 1.5 MB\r\x1b[Kpip: installing 1 package" in seen, seen


def _read(fd: int) -> bytes:
    try:
        return os.read(fd, 4096)
    except OSError:  # EIO: the child's side closed
        return b""
