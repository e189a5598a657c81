"""GraphQL over SSE as a test reads it: the (event, data) pairs of a stream."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any


def sse_events(lines: Iterator[str]) -> Iterator[tuple[str, Any]]:
    """Yield (event, data) of an SSE stream (comments skipped)."""
    event, data = None, []
    for line in lines:
        if line.startswith(":"):
            continue
        if line.startswith("event:"):
            event = line.removeprefix("event:").strip()
        elif line.startswith("data:"):
            data.append(line.removeprefix("data:").strip())
        elif line == "" and event is not None:
            yield event, json.loads("\n".join(data)) if data and data[0] else None
            event, data = None, []
