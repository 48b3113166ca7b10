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

from fedlightning.methods.dcsgd import DCSGD
from fedlightning.methods.diana import DIANA, VRDIANA
from fedlightning.methods.eflops import EFLoPS
from fedlightning.methods.fedavg import FedAvg
from fedlightning.methods.fedavg_prune import FedAvgPrune
from fedlightning.methods.fediht import FedIHT
from fedlightning.methods.fedpm import FedPM
from fedlightning.methods.fedprox import FedProx
from fedlightning.methods.fedshuffle import FedShuffle
from fedlightning.methods.fjord import ExtendedFederatedDropout, FjORD
from fedlightning.methods.supermask import Supermask
from fedlightning.methods.zampling import Zampling

__all__ = [
    "DCSGD",
    "DIANA",
    "VRDIANA",
    "EFLoPS",
    "ExtendedFederatedDropout",
    "FedAvg",
    "FedAvgPrune",
    "FedIHT",
    "FedPM",
    "FedProx",
    "FedShuffle",
    "FjORD",
    "Supermask",
    "Zampling",
]
