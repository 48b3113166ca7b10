"""The engine's host time per client of a round, with the maths made negligible: the cost a GPU cannot hide.

On an accelerator a round's tensor work is fast, and what grows with the cohort is the host's
work per client: drawing its batch schedule, its row of the share's bookkeeping, its message
and its fold into the sums. This script measures that slope on any machine. FedAvg on MNIST
(1,000 IID clients × 60 samples, batch 10, plain SGD lr 0.05, one torch thread) with a 784-4-10
MLP, whose steps cost next to nothing, at K = 100 and K = 1,000 clients a round; the slope
(round(K=1,000) − round(K=100)) / 900 is the host time per client. Arms:

* ``fused``: the sequential backend (``local_execution=fused``), each client's steps included;
* ``vectorised``: the share trained at once (``local_execution=vectorised``), its stacked steps
  included (on a CPU these are real work: ``torch.func.vmap`` of every step);
* ``vectorised_host``: the same with :func:`~fedlightning.federated.local.vectorised.train_stacked`
  replaced by a stand-in that returns the received model for every client: only the engine's
  host work per client is left (schedules, plan, checks, uplink, fold, statistics).

CPU seconds of this process (wall seconds on a GPU), the first round of each run not counted,
medians over the rounds of ``--repeats`` runs per arm and cohort size, in turn. The trainer takes
Lightning's default device (a GPU where there is one; ``benchmarks/gpu_check.py`` runs the
vectorised arms there)::

    python benchmarks/host_cost.py --data-root ../shared/data --arms vectorised_host,fused
    PYTHONPATH=<another tree> python benchmarks/host_cost.py --data-root ../shared/data   # A/B of trees
    python benchmarks/host_cost.py --data-root ../shared/data --json out.json             # also as JSON
"""

from __future__ import annotations

import argparse
import functools
import itertools
import json
import statistics
import time
from collections.abc import Callable
from typing import Any

import lightning as L
import torch
from perf.trainers import bare_trainer  # benchmarks/ is sys.path[0]
from torch import Tensor, nn

from fedlightning.datamodules import IIDPartition, MNISTDataModule
from fedlightning.federated.local import vectorised
from fedlightning.methods import FedAvg
from fedlightning.sampling import UniformSampler

CLIENTS, SMALL, LARGE, BATCH, LR = 1000, 100, 1000, 10, 0.05
ARMS = ("fused", "vectorised", "vectorised_host")


class _RoundClock(L.Callback):
    """Seconds from one round's start to the next (the test pass included): this process's CPU seconds on a
    CPU, wall seconds on an accelerator (whose kernels run while the host goes on)."""

    def __init__(self) -> None:
        self.marks: list[float] = []
        self.clock = time.perf_counter if torch.cuda.is_available() else time.process_time

    def on_train_batch_start(self, *args: object) -> None:
        self.marks.append(self.clock())

    def on_train_end(self, *args: object) -> None:
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        self.marks.append(self.clock())

    def rounds(self) -> list[float]:
        return [b - a for a, b in itertools.pairwise(self.marks)][1:]  # the first is start-up


def _received_model_for_every_client(*, start: dict[str, Tensor], plan: Any, **_: Any) -> tuple[Any, Tensor, Tensor]:
    """A stand-in for ``train_stacked``: no steps; every client ends at the received model, with zero losses."""
    k, device = plan.index.shape[0], next(iter(start.values())).device
    zeros = torch.zeros(k, device=device)
    return {n: t.unsqueeze(0).expand(k, *t.shape) for n, t in start.items()}, zeros, zeros.clone()


def round_seconds(dm: MNISTDataModule, arm: str, cohort: int, rounds: int) -> list[float]:
    """Seconds of each round after the first of one run of ``arm`` with ``cohort`` clients a round."""
    model = nn.Sequential(nn.Flatten(), nn.Linear(784, 4), nn.ReLU(), nn.Linear(4, 10))
    module = FedAvg(
        model=model,
        datamodule=dm,
        batch_size=BATCH,
        client_optimizer=functools.partial(torch.optim.SGD, lr=LR),
        local_execution="fused" if arm == "fused" else "vectorised",
    )
    clock = _RoundClock()
    trainer = bare_trainer(callbacks=[UniformSampler(clients_per_round=cohort), clock], rounds=rounds + 1, eval_every=1)
    real = vectorised.train_stacked
    if arm == "vectorised_host":
        vectorised.train_stacked = _received_model_for_every_client  # type: ignore[assignment]
    try:
        trainer.fit(module)
    finally:
        vectorised.train_stacked = real
    return clock.rounds()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-root", required=True)
    parser.add_argument("--arms", default="vectorised_host,vectorised,fused", help=f"comma-separated: {ARMS}")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", default=None, help="also write every arm's figures here")
    args = parser.parse_args()
    arms = args.arms.split(",")
    if unknown := set(arms) - set(ARMS):
        parser.error(f"unknown arm(s) {sorted(unknown)}; choose from {', '.join(ARMS)}")
    torch.set_num_threads(1)
    dm = MNISTDataModule(root=args.data_root, num_clients=CLIENTS, partition=IIDPartition(), val_fraction=0.0)
    dm.setup("fit")
    times: dict[tuple[str, int], list[float]] = {}
    runs: list[tuple[str, int, Callable[[], list[float]]]] = [
        (arm, k, functools.partial(round_seconds, dm, arm, k, args.rounds)) for arm in arms for k in (SMALL, LARGE)
    ]
    for _ in range(args.repeats):  # in turn, so machine load hits every arm alike
        for arm, k, run in runs:
            times.setdefault((arm, k), []).extend(run())
    results = {}
    for arm in arms:
        small, large = statistics.median(times[arm, SMALL]), statistics.median(times[arm, LARGE])
        per_client = (large - small) / (LARGE - SMALL)
        results[arm] = {"round_s": {SMALL: small, LARGE: large}, "host_s_per_client": per_client}
        print(
            f"{arm}: K={SMALL} {small * 1e3:.1f} ms, K={LARGE} {large * 1e3:.1f} ms a round; "
            f"host time per client {per_client * 1e6:.1f} us"
        )
    if args.json:
        device = "cuda" if torch.cuda.is_available() else "cpu"
        clock = "wall" if device == "cuda" else "cpu"
        report = {"device": device, "clock": clock, "repeats": args.repeats, "rounds": args.rounds, "arms": results}
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)


if __name__ == "__main__":
    main()
