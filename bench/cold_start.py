"""`make demo` from a fresh clone: the time to its first answer, cold (empty caches), then warm.

    flock /tmp/iqgraph-spark.lock .venv/bin/python bench/cold_start.py [--warm-runs 2]

Clones this repository's HEAD into a new temporary directory and points pip's cache (PIP_CACHE_DIR), the jar
cache (XDG_CACHE_HOME, where ~/.cache/iqgraph moves; IQGRAPH_KAFKA_HOME and IQGRAPH_SPARK_KAFKA_HOME unset) and
Maven's own repository (MAVEN_OPTS=-Dmaven.repo.local) at empty directories beside it. Runs `make demo` there with
each output line timestamped and stops it as a terminal's Ctrl-C would (SIGINT to its process group) once it has
printed its example query: the first answer from the node. Then runs `make demo` again in the same clone, warm.
Prints per run when each phase ended, in seconds after `make demo` started, and the demo's ready line; the logs
stay in the directory printed first. Standard library only.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: The line that ends each phase of `make demo`, in order (a warm run has no pip or jars line).
PHASES = {
    "pip done": re.compile(r"apache_kafka fetch$"),  # the Makefile's next step starts
    "jars done": re.compile(r"^touch \S*\.installed$"),
    "broker ready": re.compile(r": broker at "),
    "node ready": re.compile(r" is ready "),
    "first answer": re.compile(r": an example query to paste"),
}
FIRST_ANSWER_TIMEOUT_S = 900.0


def run_demo(clone: Path, env: dict[str, str], log: Path) -> dict[str, float | str]:
    """Run `make demo` in clone until its first answer; return when each phase ended and the ready line."""
    found: dict[str, float | str] = {}
    began = time.monotonic()
    with (
        log.open("w") as out,
        subprocess.Popen(  # noqa: S603 - make from PATH, fixed arguments
            ["make", "demo"], cwd=clone, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,  # noqa: S607
            start_new_session=True, text=True,
        ) as make,
    ):  # fmt: skip
        assert make.stdout is not None  # noqa: S101 - stdout=PIPE
        stopped = False
        for line in make.stdout:  # to the end: the demo says how it stops its producer, node and broker
            now = time.monotonic() - began
            out.write(f"{now:8.2f} {line}")
            for phase, pattern in PHASES.items():
                if phase not in found and pattern.search(line.rstrip("\n")):
                    found[phase] = round(now, 1)
                    if phase == "node ready":
                        found["ready line"] = line.strip()
            if not stopped and ("first answer" in found or now > FIRST_ANSWER_TIMEOUT_S):
                os.killpg(make.pid, signal.SIGINT)
                stopped = True
    return found


def main() -> int:
    """Run the cold start and the warm runs; print their phases."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--warm-runs", type=int, default=2)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="iqgraph-cold-start-"))
    clone, caches = work / "clone", {name: work / name for name in ("pip-cache", "xdg-cache", "m2")}
    for directory in caches.values():
        directory.mkdir()
    subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True)  # noqa: S603, S607
    commit = subprocess.run(  # noqa: S603
        ["git", "-C", str(clone), "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True  # noqa: S607
    ).stdout.strip()
    unset = ("IQGRAPH_KAFKA_HOME", "IQGRAPH_SPARK_KAFKA_HOME", "MAKELEVEL", "MAKEFLAGS", "MFLAGS")  # as a user's
    env = {k: v for k, v in os.environ.items() if k not in unset}
    env |= {
        "PIP_CACHE_DIR": str(caches["pip-cache"]),
        "XDG_CACHE_HOME": str(caches["xdg-cache"]),
        "MAVEN_OPTS": f"{env.get('MAVEN_OPTS', '')} -Dmaven.repo.local={caches['m2']}".strip(),
    }
    print(f"clone of {commit} and its logs in {work}", flush=True)
    for index, name in enumerate(["cold", *(f"warm {i + 1}" for i in range(args.warm_runs))]):
        load = os.getloadavg()[0]
        found = run_demo(clone, env, work / f"run-{index}.log")
        phases = "  ".join(f"{phase} {found[phase]} s" for phase in PHASES if phase in found)
        print(f"{name} (load {load:.1f}): {phases}\n  {found.get('ready line', 'no ready line')}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
