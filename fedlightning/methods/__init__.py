"""Federated methods, one module per family; each is a ``FederatedModule`` subclass."""

from fedlightning.methods.fedavg import FedAvg

__all__ = ["FedAvg"]
