"""The Kafka drill of issue 42 as a benchmark: its figures, outside pytest.

What it runs is tests/support/kafka_drill.py's `run_drill` (the slow test tests/e2e/test_kafka_drill.py checks the
same run): a 3-broker Apache Kafka cluster (RF 3, min.insync.replicas 2), three shop nodes with one standby per
partition (``local[1]`` Spark, 768 MB each), an idempotent acks=all producer at 40 orders/s and a reader of every
key on every node; a rolling restart of the brokers, a kill -9 of the controller leader, the whole cluster down for
30 s. It prints: answers and failures, produce -> queryable with every broker up (the baseline), during the roll
(p50, p99, max; the roll's p99 over the baseline's: the machine's own speed divided out) and after it, each
return's time to every node's progress, and one JSON object with every figure as the last line.

Usage (two cores: the lock queues it behind other Spark runs): ``flock /tmp/iqgraph-spark.lock .venv/bin/python
bench/kafka_drill.py`` (~5 minutes).
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.support.kafka_drill import errors_by_kind, figures, percentile, run_drill, wrong  # noqa: E402


def main() -> int:
    with tempfile.TemporaryDirectory(prefix="iqgraph-kafka-drill-") as home:
        for drill in run_drill(Path(home)):
            print(figures(drill))
            roll, baseline = drill.freshness(*drill.roll), drill.freshness(*drill.baseline)
            roll_p99, baseline_p99 = percentile(roll, 99), percentile(baseline, 99)
            answers = drill.reader.answers
            summary = {
                "orders": drill.ingest.produced,
                "answers": len(answers),
                "failed": sum(1 for a in answers if a.errors),
                "errors": dict(errors_by_kind(answers)),
                "wrong": len(wrong(drill)),
                "fresh_roll_p99_s": round(roll_p99, 2),
                "fresh_baseline_p99_s": round(baseline_p99, 2),
                "fresh_roll_over_baseline_p99": round(roll_p99 / baseline_p99, 2) if baseline_p99 else None,
                "fresh_roll_max_s": round(max(roll, default=0), 2),
                "returns": {r.what: {n: round(s, 1) for n, s in r.progress.items()} for r in drill.returns},
            }
            print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
