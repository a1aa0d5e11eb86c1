"""What a fault test reports: one summary line, and its numbers kept for later with
``NOTIFIER_FAULT_REPORT`` set (docs/scaling.md quotes such a file)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any


def report(name: str, numbers: dict[str, Any]) -> None:
    """Print ``numbers`` on one line under ``name``; with ``NOTIFIER_FAULT_REPORT`` naming a JSON
    file, also merge them into it under ``name``, beside what other tests put there."""
    print(f"\n[{name}] " + " ".join(f"{k}={v}" for k, v in numbers.items()))
    path = os.environ.get("NOTIFIER_FAULT_REPORT")
    if path:
        file = Path(path)
        merged = json.loads(file.read_text()) if file.exists() and file.stat().st_size else {}
        merged[name] = numbers
        file.write_text(json.dumps(merged, indent=2) + "\n")
