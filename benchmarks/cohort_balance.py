"""How evenly 2 processes share a round's local work: the split by client id against the deal by load.

FedShuffle with local epochs drawn uniformly from {1, ..., 5} per client and round (the most
uneven local work among the methods that are dealt) on the bundled digits, Dirichlet client
sizes, batch 32, uniform cohorts from a fixed stream. For each round the busier process's
local steps are divided by half the round's total; the mean over the rounds, minus one, is
how much longer than an even split that process works. No training runs: the loads are
those :meth:`FederatedModule.cohort_loads` hands to the deal.

    python benchmarks/cohort_balance.py --rounds 200
"""

from __future__ import annotations

import argparse
import statistics

import torch

from fedlightning.datamodules import DigitsDataModule
from fedlightning.federated.cohort import Cohort, deal_by_load
from fedlightning.methods import FedShuffle
from fedlightning.models import LogisticRegression


def busier_share(loads: list[float], parts: list[int]) -> float:
    """The larger of the two processes' loads over an even split (1.0 is even)."""
    return max(sum(w for w, p in zip(loads, parts, strict=True) if p == r) for r in (0, 1)) / (sum(loads) / 2)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=200)
    args = parser.parse_args()
    for clients, per_round in ((10, 10), (100, 10), (100, 30)):
        dm = DigitsDataModule(num_clients=clients, seed=0)
        dm.setup("fit")
        model = LogisticRegression(in_features=64, num_classes=10)
        method = FedShuffle(model=model, datamodule=dm, batch_size=32, local_epochs=[1, 5])
        draws = torch.Generator().manual_seed(0)
        by_id, dealt = [], []
        for round_idx in range(args.rounds):
            ids = tuple(sorted(torch.randperm(clients, generator=draws)[:per_round].tolist()))
            cohort = Cohort(round_idx=round_idx, client_ids=ids, inclusion_probabilities=torch.ones(per_round))
            loads = method.cohort_loads(cohort)
            by_id.append(busier_share(loads, [cid % 2 for cid in ids]))
            dealt.append(busier_share(loads, deal_by_load(loads, 2)))
        print(
            f"{clients} clients, {per_round} per round: the busier process works "
            f"{statistics.mean(by_id) - 1:.1%} (split by id) and {statistics.mean(dealt) - 1:.1%} (dealt by load) "
            "longer than an even split"
        )


if __name__ == "__main__":
    main()
