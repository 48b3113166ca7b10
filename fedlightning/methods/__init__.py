"""Federated methods, one module per family; each is a ``FederatedModule`` subclass.

========================  ============================================================
``FedAvg``                McMahan et al. 2017 (with FedOpt server optimisers)
``FedProx``               Li et al. 2020 (arXiv 1812.06127): a proximal term per client
``DCSGD``, ``DIANA``,     Horváth thesis (arXiv 2207.00392), ch. 3–5: compressed SGD,
``VRDIANA``               error feedback, DIANA and VR-DIANA
``Zampling``,             Local/Federated Zampling and the continuous model
``Supermask``, ``FedPM``  (arXiv 2503.14246), Zhou et al. 2019, Isik et al. 2023
``EFLoPS``, ``FedIHT``,   E-FLoPS and its baselines (Fed-IHT, FedAvg + magnitude
``FedAvgPrune``           pruning)
``FjORD``                 FjORD's ordered dropout over device tiers (arXiv 2102.13451)
                          and its eFD baseline, ``ExtendedFederatedDropout``
``FedShuffle``            FedShuffleGen (arXiv 2204.13169; thesis ch. 8): FedShuffle,
                          FedNova, FedAvg, FedAvgMin/Mean with heterogeneous epochs
========================  ============================================================
"""

from __future__ import annotations

from fedlightning._lazy import lazy_getattr

_EXPORTS = {
    "DCSGD": "dcsgd",
    "DIANA": "diana",
    "VRDIANA": "diana",
    "EFLoPS": "eflops",
    "FedAvg": "fedavg",
    "FedAvgPrune": "fedavg_prune",
    "FedIHT": "fediht",
    "ExtendedFederatedDropout": "fjord",
    "FedPM": "fedpm",
    "FedProx": "fedprox",
    "FedShuffle": "fedshuffle",
    "FjORD": "fjord",
    "Supermask": "supermask",
    "Zampling": "zampling",
}

__all__ = sorted(_EXPORTS)

__getattr__ = lazy_getattr(__name__, _EXPORTS)  # using one method family imports only that one
