"""Chrome trace-event JSON (openable in Perfetto / chrome://tracing) from a recorded run.

One process row per pipeline stage for its tasks, one per link for its transfers.
Times are in microseconds, as the format requires.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from simcluster.engine.simulator import EngineResult
from simcluster.output_files import write_text_atomically

_US_PER_S = 1e6


def trace_events(result: EngineResult) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = []
    num_stages = len(result.stages)
    for stage in range(num_stages):
        events.append(
            {"ph": "M", "name": "process_name", "pid": stage, "tid": 0, "args": {"name": f"stage {stage}"}}
        )
    for stage, name, category, start_s, duration_s in result.spans:
        events.append(
            {
                "ph": "X",
                "name": name,
                "cat": category,
                "pid": stage,
                "tid": 0,
                "ts": start_s * _US_PER_S,
                "dur": duration_s * _US_PER_S,
            }
        )
    for offset, (link, spans) in enumerate(sorted(result.link_spans.items())):
        pid = num_stages + offset
        events.append(
            {"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": f"link {link}"}}
        )
        for start_s, duration_s, label in spans:
            events.append(
                {
                    "ph": "X",
                    "name": label or "transfer",
                    "cat": "link",
                    "pid": pid,
                    "tid": 0,
                    "ts": start_s * _US_PER_S,
                    "dur": duration_s * _US_PER_S,
                }
            )
    return events


def write_trace(result: EngineResult, path: Path) -> None:
    text = json.dumps({"traceEvents": trace_events(result), "displayTimeUnit": "ms"})
    write_text_atomically(path, text)
