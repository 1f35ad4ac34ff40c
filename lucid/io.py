"""Reading lucid's logs: the JSONL files a run appends to (metrics.jsonl, episodes.jsonl)."""

from __future__ import annotations

import json
from pathlib import Path


def read_jsonl(path: Path) -> list[dict]:
    """Rows of a JSONL file; a line that is not JSON (the torn last line of a run killed
    mid-write, or one damaged later) is skipped, and the rows after it are kept."""
    rows = []
    if not path.exists():
        return rows
    for line in path.read_text().splitlines():
        line = line.strip()
        if not line:
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return rows
