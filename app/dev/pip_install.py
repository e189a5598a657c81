"""Run ``pip install`` showing its downloads and how long it took, instead of pip's page of "Collecting" lines.

The Makefile installs through it (``.venv/bin/python app/dev/pip_install.py -e '.[test]'``); a first install reads:

    pip: downloading pyspark-4.2.0.tar.gz (450.1 MB)
    pip:   212.4 of 450.1 MB                (on a terminal one line updated in place; in a log one per 10 s)
    pip: downloading pyarrow-26.0.1-cp311-cp311-manylinux_2_28_x86_64.whl (55.0 MB)
    pip: and 52 smaller downloads (6.1 MB)
    pip: building a wheel for pyspark from its source (pip caches it for the next install)
    pip: installing 70 packages
    pip: done in 55.9 s: 70 packages installed; 68 downloads (650.3 MB)

Without ``-q``, as pip's download progress needs (with ``-q`` pip draws no bar whatever ``--progress-bar`` says),
and with ``--progress-bar raw`` (pip 24.1+), whose "Progress N of M" lines this turns into the line above. pip's
warnings and errors (its stderr) pass through as they are; when pip fails, the lines held back are printed too.
The exit code is pip's. Standard library only: it runs before anything else is installed.
"""

from __future__ import annotations

import collections
import importlib.metadata
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TextIO

PREFIX = "pip: "
NAMED_FROM_BYTES = 1_000_000  # a download this large gets its own line; smaller ones are summed in one
LOG_PROGRESS_EVERY_S = 10.0  # progress lines in a log (not a terminal): at most one per this many seconds
HELD_BACK = 60  # the last lines of pip's output kept to print when it fails
# setuptools says "Editable installation ... folders in your working directory with the same name as your package
# may take precedence" on every editable install of a package-dir mapping (its meta path finder strategy, the only
# one that can map iqgraph.app to app/). Our folder of that name, iqgraph/, is the package itself: nothing to heed.
QUIET_WARNINGS = "ignore:Editable installation"

_DOWNLOAD = re.compile(r"^\s*(Downloading|Using cached) (\S+)(?: \(([\d.]+) (B|kB|MB|GB)\))?")
_PROGRESS = re.compile(r"^Progress (\d+) of (\d+)$")
_BUILDING = re.compile(r"^\s*Building wheel for (\S+) .*: started$")
_INSTALLING = re.compile(r"^Installing collected packages: (.*)$")
_INSTALLED = re.compile(r"^Successfully installed (.*)$")
_UNITS = {"B": 1, "kB": 1e3, "MB": 1e6, "GB": 1e9}


def counted(count: int, noun: str) -> str:
    """Return "1 package", "2 packages"."""
    return f"{count} {noun}{'' if count == 1 else 's'}"


def size_text(size: float) -> str:
    """Return size in bytes as pip writes it (450.1 MB)."""
    for unit, factor in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if size >= factor:
            return f"{size / factor:.1f} {unit}"
    return f"{size:.0f} B"


@dataclass
class Tally:
    """A number of files and their bytes."""

    count: int = 0
    size: float = 0.0

    def add(self, size: float) -> None:
        self.count += 1
        self.size += size


class Report:
    """Turn pip's output, line by line, into the lines this script prints."""

    def __init__(self, out: TextIO, terminal: bool) -> None:
        self.out = out
        self.terminal = terminal
        self.began = time.monotonic()
        self.downloads = Tally()
        self.cached = Tally()
        self.unsaid = Tally()  # small downloads not yet summed in a line
        self.installed = 0
        self.held: collections.deque[str] = collections.deque(maxlen=HELD_BACK)
        self._progress_said = 0.0
        self._open = False  # a progress line updated in place is on the terminal

    def feed(self, line: str) -> None:
        """Read one line of pip's standard output."""
        line = line.rstrip("\n")
        if progress := _PROGRESS.match(line):
            self._progress(int(progress.group(1)), int(progress.group(2)))
        elif download := _DOWNLOAD.match(line):
            self._download(download.group(1) == "Using cached", download.group(2), download.group(3), download.group(4))
        elif building := _BUILDING.match(line):
            self._flush_small()
            name = building.group(1)
            self.say(f"building a wheel for {name} from its source (pip caches it for the next install)")
        elif installing := _INSTALLING.match(line):
            self._flush_small()
            self.say(f"installing {counted(len(installing.group(1).split(', ')), 'package')}")
        elif installed := _INSTALLED.match(line):
            self.installed = len(installed.group(1).split())
        else:
            self.held.append(line)

    def finish(self, returncode: int) -> None:
        """Say how the install went: what it downloaded and how long it took, or pip's held-back lines."""
        self._flush_small()
        took = time.monotonic() - self.began
        if returncode != 0:
            self.say(f"failed (exit {returncode}) after {took:.1f} s; pip's last lines:")
            for line in self.held:
                print(line, file=self.out, flush=True)
            return
        done = f"{counted(self.installed, 'package')} installed" if self.installed else "nothing to install"
        got, cached = self.downloads, self.cached
        done += f"; {counted(got.count, 'download')} ({size_text(got.size)})" if got.count else "; nothing downloaded"
        if cached.count:
            done += f"; {cached.count} from pip's cache ({size_text(cached.size)})"
        self.say(f"done in {took:.1f} s: {done}")

    def say(self, message: str) -> None:
        """Print one line of ours."""
        self._close()
        print(PREFIX + message, file=self.out, flush=True)

    def _download(self, cached: bool, name: str, number: str | None, unit: str | None) -> None:
        nbytes = float(number) * _UNITS[unit] if number is not None and unit is not None else 0.0
        (self.cached if cached else self.downloads).add(nbytes)
        if cached:
            return
        if number is None or nbytes >= NAMED_FROM_BYTES:
            self.say(f"downloading {name}" + (f" ({number} {unit})" if number else ""))
            self._progress_said = time.monotonic()
        else:
            self.unsaid.add(nbytes)

    def _progress(self, current: int, total: int) -> None:
        done = f"  {size_text(current)} of {size_text(total)}" if total else f"  {size_text(current)}"
        if self.terminal:
            self.out.write(f"\r\033[K{PREFIX}{done}")
            self.out.flush()
            self._open = True
        elif time.monotonic() - self._progress_said >= LOG_PROGRESS_EVERY_S and current != total:
            self.say(done)
            self._progress_said = time.monotonic()

    def _flush_small(self) -> None:
        small, self.unsaid = self.unsaid, Tally()
        if small.count:
            self.say(f"and {counted(small.count, 'smaller download')} ({size_text(small.size)})")

    def _close(self) -> None:
        if self._open:
            self.out.write("\r\033[K")
            self._open = False


def pip_command(args: Iterable[str]) -> list[str]:
    """Return the pip install command: raw progress lines where this pip has them (24.1+)."""
    version = re.match(r"(\d+)\.(\d+)", importlib.metadata.version("pip"))
    raw = version is not None and (int(version.group(1)), int(version.group(2))) >= (24, 1)
    progress = ["--progress-bar", "raw"] if raw else []
    return [sys.executable, "-m", "pip", "install", *progress, *args]


def main(args: list[str]) -> int:
    """Run pip install with args; return its exit code."""
    env = dict(os.environ)
    env["PYTHONWARNINGS"] = ",".join(filter(None, [env.get("PYTHONWARNINGS"), QUIET_WARNINGS]))
    report = Report(sys.stdout, sys.stdout.isatty())
    with subprocess.Popen(  # noqa: S603 - this interpreter's pip, the Makefile's arguments
        pip_command(args), stdout=subprocess.PIPE, text=True, env=env, bufsize=1
    ) as pip:
        assert pip.stdout is not None  # noqa: S101 - stdout=PIPE
        try:
            for line in pip.stdout:
                report.feed(line)
        except KeyboardInterrupt:  # the terminal's Ctrl-C reached pip too: let it stop, say nothing more
            pip.wait()
            return 130
    report.finish(pip.returncode)
    return pip.returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
