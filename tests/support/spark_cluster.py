"""A Spark standalone cluster on loopback, started from the pyspark installation: one master, workers on demand.

The master and each worker are JVMs run with ``spark-class`` (``org.apache.spark.deploy.master.Master`` /
``…worker.Worker``), as a user would on real machines; a worker can be killed with SIGKILL (with the
executors it launched) and another one started. Used by the cluster tests and ``bench/ingest.py --spark-master``.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import pyspark

from iqgraph.streaming.broker import free_port

SPARK_HOME = Path(pyspark.__file__).parent


@dataclass
class StandaloneCluster:
    """A master on 127.0.0.1 and the workers started so far; stop() ends them all."""

    home: Path
    master_port: int = field(default_factory=free_port)
    master: subprocess.Popen[bytes] | None = None
    workers: list[subprocess.Popen[bytes]] = field(default_factory=list)

    @property
    def url(self) -> str:
        """Return the master's URL, for --spark-master."""
        return f"spark://127.0.0.1:{self.master_port}"

    def _env(self) -> dict[str, str]:
        return {
            **os.environ,
            "SPARK_HOME": str(SPARK_HOME),
            "SPARK_LOCAL_IP": "127.0.0.1",
            "SPARK_MASTER_OPTS": "-Dspark.master.rest.enabled=false",
            "SPARK_WORKER_OPTS": "-Dspark.worker.cleanup.enabled=false",
        }

    def _spawn(self, name: str, *args: str) -> subprocess.Popen[bytes]:
        log = (self.home / f"{name}.log").open("ab")
        return subprocess.Popen(
            [str(SPARK_HOME / "bin" / "spark-class"), *args],
            env=self._env(),
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group: a kill reaches the executors it launched
        )

    def start(self) -> StandaloneCluster:
        """Start the master and wait until it is ALIVE."""
        self.home.mkdir(parents=True, exist_ok=True)
        self.master = self._spawn(
            "master", "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
            "--port", str(self.master_port), "--webui-port", str(free_port()),
        )  # fmt: skip
        self._wait_for("master", "I have been elected leader", self.master)
        return self

    def add_worker(self, cores: int = 2, memory: str = "2g") -> subprocess.Popen[bytes]:
        """Start a worker with cores and memory for executors; wait until the master registered it."""
        name = f"worker-{len(self.workers)}"
        worker = self._spawn(
            name, "org.apache.spark.deploy.worker.Worker", "--host", "127.0.0.1", "--port", str(free_port()),
            "--webui-port", str(free_port()), "--cores", str(cores), "--memory", memory,
            "--work-dir", str(self.home / name), self.url,
        )  # fmt: skip
        self.workers.append(worker)
        self._wait_for(name, "Successfully registered with master", worker)
        return worker

    def kill_worker(self, worker: subprocess.Popen[bytes]) -> None:
        """Kill -9 a worker and every executor it launched (its process group)."""
        try:
            os.killpg(worker.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        worker.wait(timeout=60)

    def stop(self) -> None:
        """Kill every worker and the master."""
        for process in [*self.workers, *([self.master] if self.master else [])]:
            if process.poll() is None:
                self.kill_worker(process)

    def _wait_for(self, name: str, line: str, process: subprocess.Popen[bytes], timeout: float = 90) -> None:
        log = self.home / f"{name}.log"
        deadline = time.monotonic() + timeout
        while line not in log.read_text(errors="replace"):
            if process.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"Spark {name} did not start:\n{log.read_text(errors='replace')[-3000:]}")
            time.sleep(0.2)
