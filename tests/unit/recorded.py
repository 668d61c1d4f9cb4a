"""Management API answers recorded from a real broker by tests/record_doctor.py."""

import json
from pathlib import Path
from typing import Any

from ricochet.ops.checks import BrokerState
from ricochet.settings import Settings

DATA = Path(__file__).parent / "data"


def recorded(name: str) -> tuple[Settings, BrokerState]:
    """The settings a recording was made with, and the answers (a fresh copy on every call)."""
    data = json.loads((DATA / f"doctor_{name}.json").read_text())
    return Settings(**data["settings"]), BrokerState(**data["state"])


def edited(name: str, queue: str, **fields: Any) -> tuple[Settings, BrokerState]:
    """A recording with some fields of one queue's answer changed (None removes the field)."""
    settings, state = recorded(name)
    answer = state.queues[queue]
    for key, value in fields.items():
        if value is None:
            answer.pop(key, None)
        else:
            answer[key] = value
    return settings, state
