"""The federated engine: rounds, cohorts, client state, random streams, aggregation maths.

Names are imported lazily so that low-level modules (``message``, ``rng``) can be used by
codecs without importing the round engine (which itself uses the codecs).
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "ClientResult": "module",
    "ClientUpload": "module",
    "FederatedModule": "module",
    "ClientSampler": "hooks",
    "FederatedCallback": "hooks",
    "ClientStateStore": "state",
    "Codec": "message",
    "Message": "message",
    "Cohort": "cohort",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(f"fedlightning.federated.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module 'fedlightning.federated' has no attribute {name!r}")
