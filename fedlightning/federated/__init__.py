"""The federated engine: rounds, cohorts, channels, aggregators, client state, random streams."""

from __future__ import annotations

from fedlightning.federated.aggregators import Aggregator, WeightedMean
from fedlightning.federated.channel import Channel
from fedlightning.federated.cohort import Cohort
from fedlightning.federated.hooks import ClientSampler, FederatedCallback
from fedlightning.federated.message import Codec, Message
from fedlightning.federated.module import ClientResult, FederatedModule, LocalTraining
from fedlightning.federated.payloads import Payload
from fedlightning.federated.state import ClientStateStore

__all__ = [
    "Aggregator",
    "Channel",
    "ClientResult",
    "ClientSampler",
    "ClientStateStore",
    "Codec",
    "Cohort",
    "FederatedCallback",
    "FederatedModule",
    "LocalTraining",
    "Message",
    "Payload",
    "WeightedMean",
]
