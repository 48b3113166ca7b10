"""FedAvg and the FedOpt family.

Paper: McMahan et al., "Communication-Efficient Learning of Deep Networks from
Decentralized Data", AISTATS 2017, arXiv 1602.05629. Server optimisers: Reddi et al.,
"Adaptive Federated Optimization", ICLR 2021, arXiv 2003.00295 (FedAdam, FedYogi,
FedAdagrad); Hsu et al., arXiv 1909.06335 (FedAvgM).

Each client runs ``local_epochs`` (or ``local_steps``) of SGD from the broadcast weights and
uploads its model delta Δ_k; the server forms Δ = Σ_k (n_k/n) Δ_k over the cohort and hands
−Δ to its optimiser: ``SGD(lr=1)`` gives FedAvg, SGD with momentum FedAvgM, and
``FedOpt(variant=...)`` the adaptive methods. All of this is :class:`FederatedModule`'s
default behaviour; the class exists to name the method.
"""

from __future__ import annotations

from fedlightning.federated.module import FederatedModule


class FedAvg(FederatedModule):
    """Federated averaging with a configurable server optimiser (FedAvg, FedAvgM, FedOpt)."""

    stateless_clients = True  # a client starts every round from the broadcast and keeps nothing
