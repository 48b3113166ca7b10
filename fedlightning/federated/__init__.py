"""The federated engine: rounds, cohorts, client state, random streams, aggregation maths."""

from fedlightning.federated.cohort import Cohort
from fedlightning.federated.hooks import ClientSampler, FederatedCallback
from fedlightning.federated.message import Codec, Message
from fedlightning.federated.module import ClientResult, ClientUpload, FederatedModule
from fedlightning.federated.state import ClientStateStore

__all__ = [
    "ClientResult",
    "ClientSampler",
    "ClientStateStore",
    "ClientUpload",
    "Codec",
    "Cohort",
    "FederatedCallback",
    "FederatedModule",
    "Message",
]
