"""FjORD's full width against FedAvg trained only on the clients that can run the full model.

    python benchmarks/fjord_capable_fedavg.py [--data mnist|digits] [--data-root ../shared/data]
        [--clients 10] [--rounds 10] [--seeds 0 1 2] [--lr 0.1] [--no-distillation]

FjORD (arXiv 2102.13451, uniform-5 widths and tiers, drop scale 1) trains on every client; the
baseline is FedAvg with the same model, initialisation, client optimiser (SGD, no momentum),
batch size and one local epoch, run on the top-tier clients only (every round, the same
cohort FjORD's tier assignment puts at p_max = 1). Both use full participation of their
clients. Prints one Markdown row per seed and the mean difference (FjORD at p = 1 minus
FedAvg), test accuracy on the full test set.
"""

from __future__ import annotations

import argparse
import logging
import statistics
import time
import warnings
from typing import Any

import lightning as L
import torch
from perf.trainers import bare_trainer  # benchmarks/ is sys.path[0]

from fedlightning.datamodules import DigitsDataModule, IIDPartition
from fedlightning.datamodules.mnist import MNISTDataModule
from fedlightning.federated.cohort import Cohort
from fedlightning.federated.hooks import ClientSampler
from fedlightning.methods.fedavg import FedAvg
from fedlightning.methods.fjord import FjORD
from fedlightning.models.presets import build_model
from fedlightning.sampling import FullParticipation


class FixedCohort(ClientSampler):
    """The same clients every round (each with inclusion probability one)."""

    def __init__(self, client_ids: list[int]) -> None:
        self.client_ids = tuple(client_ids)

    def select_cohort(self, trainer: Any, module: Any, round_idx: int) -> Cohort:
        return Cohort(
            round_idx=round_idx,
            client_ids=self.client_ids,
            inclusion_probabilities=torch.ones(len(self.client_ids)),
        )


def _trainer(rounds: int, sampler: ClientSampler) -> L.Trainer:
    return bare_trainer(callbacks=[sampler], rounds=rounds, eval_every=rounds)


def one_seed(args: argparse.Namespace, seed: int) -> tuple[float, float, list[int], float]:
    if args.data == "mnist":
        dm: Any = MNISTDataModule(
            root=args.data_root, num_clients=args.clients, partition=IIDPartition(), seed=seed, val_fraction=0.0
        )
        preset, shape = "mnistfc", (1, 28, 28)
    else:
        dm = DigitsDataModule(num_clients=args.clients, partition=IIDPartition(), seed=seed, val_fraction=0.0)
        preset, shape = "digits_mlp", (1, 8, 8)
    dm.setup("fit")
    torch.manual_seed(seed)
    init = build_model(preset, input_shape=shape, num_classes=10)
    common: dict[str, Any] = {
        "datamodule": dm,
        "seed": seed,
        "client_optimizer": lambda p: torch.optim.SGD(p, lr=args.lr),
        "local_epochs": 1,
        "batch_size": 32,
    }
    fjord = FjORD(model=_copy(init), distillation=not args.no_distillation, **common)
    capable = [c for c in range(dm.num_clients) if fjord.tiers[fjord.client_tier[c]] == 1.0]
    fedavg = FedAvg(model=_copy(init), **common)
    started = time.perf_counter()
    _trainer(args.rounds, FullParticipation()).fit(fjord)
    fjord_acc = float(_trainer(args.rounds, FullParticipation()).test(fjord, verbose=False)[0]["test/acc@1.0"])
    _trainer(args.rounds, FixedCohort(capable)).fit(fedavg)
    fedavg_acc = float(_trainer(args.rounds, FixedCohort(capable)).test(fedavg, verbose=False)[0]["test/acc"])
    return fjord_acc, fedavg_acc, capable, time.perf_counter() - started


def _copy(model: torch.nn.Module) -> torch.nn.Module:
    import copy

    return copy.deepcopy(model)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", choices=("mnist", "digits"), default="mnist")
    parser.add_argument("--data-root", default="../shared/data")
    parser.add_argument("--clients", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--no-distillation", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(1)
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    logging.getLogger("fedlightning").setLevel(logging.WARNING)
    warnings.filterwarnings("ignore")
    print("| seed | top-tier clients | FjORD test acc @ p = 1 | FedAvg on top tier | difference (pp) | seconds |")
    print("|---|---|---|---|---|---|")
    diffs = []
    for seed in args.seeds:
        fjord_acc, fedavg_acc, capable, seconds = one_seed(args, seed)
        diffs.append(100 * (fjord_acc - fedavg_acc))
        print(
            f"| {seed} | {capable} | {fjord_acc:.4f} | {fedavg_acc:.4f} | {diffs[-1]:+.2f} | {seconds:.0f} |",
            flush=True,
        )
    sd = statistics.stdev(diffs) if len(diffs) > 1 else float("nan")
    print(f"\nmean difference {statistics.mean(diffs):+.2f} pp (sd {sd:.2f}) over {len(diffs)} seeds")


if __name__ == "__main__":
    main()
