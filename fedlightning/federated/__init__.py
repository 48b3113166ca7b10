"""The federated engine: rounds, cohorts, channels, aggregators, client state, random streams.

Names are imported lazily so that low-level modules (``message``, ``rng``) can be used by
codecs without importing the round engine (which itself uses the codecs).
"""

from __future__ import annotations

from fedlightning._lazy import lazy_getattr

_EXPORTS = {
    "ClientResult": "module",
    "LocalTraining": "module",
    "Aggregator": "aggregators",
    "WeightedMean": "aggregators",
    "Channel": "channel",
    "Payload": "payloads",
    "FederatedModule": "module",
    "ClientSampler": "hooks",
    "FederatedCallback": "hooks",
    "ClientStateStore": "state",
    "Codec": "message",
    "Message": "message",
    "Cohort": "cohort",
}

__all__ = sorted(_EXPORTS)

__getattr__ = lazy_getattr(__name__, _EXPORTS)
