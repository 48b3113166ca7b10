"""Federated methods, one module per family; each is a ``FederatedModule`` subclass.

========================  ============================================================
``FedAvg``                McMahan et al. 2017 (with FedOpt server optimisers)
``DCSGD``, ``DIANA``,     Horváth thesis (arXiv 2207.00392), ch. 3–5: compressed SGD,
``VRDIANA``               error feedback, DIANA and VR-DIANA
``Zampling``,             Local/Federated Zampling and the continuous model
``Supermask``, ``FedPM``  (arXiv 2503.14246), Zhou et al. 2019, Isik et al. 2023
``EFLoPS``, ``FedIHT``,   E-FLoPS and its baselines (Fed-IHT, FedAvg + magnitude
``FedAvgPrune``           pruning)
========================  ============================================================
"""

from fedlightning.methods.dcsgd import DCSGD
from fedlightning.methods.diana import DIANA, VRDIANA
from fedlightning.methods.eflops import EFLoPS
from fedlightning.methods.fedavg import FedAvg
from fedlightning.methods.fedavg_prune import FedAvgPrune
from fedlightning.methods.fediht import FedIHT
from fedlightning.methods.fedpm import FedPM
from fedlightning.methods.supermask import Supermask
from fedlightning.methods.zampling import Zampling

__all__ = ["DCSGD", "DIANA", "VRDIANA", "EFLoPS", "FedAvg", "FedAvgPrune", "FedIHT", "FedPM", "Supermask", "Zampling"]
