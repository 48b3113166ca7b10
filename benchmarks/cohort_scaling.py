"""Seconds per round as the cohort grows: fedlightning against a plain PyTorch loop, sequential and ``vmap``.

    python benchmarks/cohort_scaling.py --device cuda --json out.json [--markdown out.md] [--data-root DIR]
    python benchmarks/cohort_scaling.py --device cpu --quick --json out.json      # a smoke run

Workloads (FedAvg, plain SGD lr 0.05, 1 local epoch, the test set evaluated after every round):

* ``s1``: MNIST ``mnistfc``, 10 clients × 6,000 samples, all 10 per round, batch 32;
* ``s2``: MNIST ``mnistfc``, 1,000 clients × 60, 100 per round drawn uniformly, batch 10;
* ``all1000``: the same federation, all 1,000 clients every round;
* ``cifar``: ``resnet18_gn``, 100 clients × 500, 10 per round, batch 32, on random inputs of
  CIFAR-10's shape (labelled as synthetic in the output: the cost of a step does not depend on
  the pixel values, and the GPU machine holds no CIFAR-10).

Arms, in turn within each repetition: ``fedlightning`` (``FedAvg`` under a ``Trainer`` with the
client sampler and the communication accountant, ``local_execution=auto``: vectorised on CUDA,
fused on a CPU); ``plain_sequential`` (each client in turn: weights copied in, SGD steps, the
weighted delta summed; every tensor on the device); ``plain_vmap`` (the cohort at once:
``torch.func.vmap`` of ``torch.func.grad`` over stacked weights). The plain arms draw their own
batches and cohorts of the same sizes. The first round of every run is not counted; the table
gives the median seconds per round and fedlightning ÷ plain ``vmap``.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import lightning as L
import torch
from torch import Tensor, nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from perf.trainers import bare_trainer  # benchmarks/ is sys.path[0]

from fedlightning.callbacks.accounting import CommunicationAccountant
from fedlightning.datamodules import IIDPartition, MNISTDataModule
from fedlightning.datamodules.base import FederatedDataModule
from fedlightning.methods import FedAvg
from fedlightning.models import build_model
from fedlightning.sampling import UniformSampler

LR = 0.05
TARGETS = {"s1": 1.1, "s2": 1.5, "all1000": 2.0}  # fedlightning ÷ plain vmap, on a GPU


@dataclass(frozen=True)
class Workload:
    name: str
    model: str
    clients: int
    per_client: int
    per_round: int
    batch: int
    synthetic: bool = False


def workloads(quick: bool) -> list[Workload]:
    if quick:
        return [
            Workload("s1", "mnistfc", 10, 600, 10, 32),
            Workload("s2", "mnistfc", 1000, 60, 100, 10),
            Workload("all1000", "mnistfc", 1000, 60, 1000, 10),
            Workload("cifar", "resnet18_gn", 10, 40, 4, 32, synthetic=True),
        ]
    return [
        Workload("s1", "mnistfc", 10, 6000, 10, 32),
        Workload("s2", "mnistfc", 1000, 60, 100, 10),
        Workload("all1000", "mnistfc", 1000, 60, 1000, 10),
        Workload("cifar", "resnet18_gn", 100, 500, 10, 32, synthetic=True),
    ]


class SyntheticImages(FederatedDataModule):
    """Random inputs of CIFAR-10's shape (3 × 32 × 32, 10 classes): a timing stand-in, not CIFAR-10."""

    name = "synthetic_cifar_shape"
    num_classes = 10
    input_shape = (3, 32, 32)
    notice = "synthetic random inputs of CIFAR-10's shape (for timing only; not CIFAR-10)"

    def _load(self) -> tuple[tuple[Tensor, Tensor], tuple[Tensor, Tensor]]:
        gen = torch.Generator().manual_seed(0)
        n = self.max_train_samples or 50_000
        x = torch.randn(n, 3, 32, 32, generator=gen)
        y = torch.randint(0, 10, (n,), generator=gen)
        return (x, y), (x[:2_000].clone(), y[:2_000].clone())


def datamodule(w: Workload, root: str | None) -> FederatedDataModule:
    samples = w.clients * w.per_client
    if w.synthetic:
        dm: FederatedDataModule = SyntheticImages(
            num_clients=w.clients, partition=IIDPartition(), val_fraction=0.0, max_train_samples=samples
        )
    else:
        subset = samples if samples < 60_000 else None
        dm = MNISTDataModule(
            root=root, num_clients=w.clients, partition=IIDPartition(), val_fraction=0.0, max_train_samples=subset
        )
    dm.setup("fit")
    return dm


def model_of(w: Workload, dm: FederatedDataModule) -> nn.Module:
    torch.manual_seed(0)
    return build_model(w.model, input_shape=dm.input_shape, num_classes=dm.num_classes)


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class RoundTimer(L.Callback):
    """Wall time from one round's start to the next (the evaluation after a round included)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.starts: list[float] = []

    def on_train_batch_start(self, *args: object) -> None:
        synchronize(self.device)
        self.starts.append(time.perf_counter())

    def on_train_end(self, *args: object) -> None:
        synchronize(self.device)
        self.starts.append(time.perf_counter())


def fedlightning_rounds(w: Workload, dm: FederatedDataModule, rounds: int, device: torch.device) -> list[float]:
    module = FedAvg(
        model=model_of(w, dm),
        datamodule=dm,
        batch_size=w.batch,
        client_optimizer=functools.partial(torch.optim.SGD, lr=LR),
        local_execution="auto",
    )
    timer = RoundTimer(device)
    sampler = [UniformSampler(clients_per_round=w.per_round)] if w.per_round < w.clients else []
    trainer = bare_trainer(
        callbacks=[*sampler, CommunicationAccountant(), timer],
        rounds=rounds + 1,
        eval_every=1,
        accelerator="gpu" if device.type == "cuda" else "cpu",
    )
    trainer.fit(module)
    return [b - a for a, b in zip(timer.starts, timer.starts[1:], strict=False)][1:]


def test_pass(model: nn.Module, x: Tensor, y: Tensor) -> float:
    """Accuracy on the test set in batches of 1,024, read once."""
    correct = torch.zeros((), device=x.device, dtype=torch.long)
    with torch.no_grad():
        for start in range(0, len(y), 1024):
            correct += (model(x[start : start + 1024]).argmax(1) == y[start : start + 1024]).sum()
    return float(correct) / len(y)


def plain_rounds(
    w: Workload, dm: FederatedDataModule, rounds: int, device: torch.device, *, vectorised: bool
) -> list[float]:
    """The plain loop's seconds per round (``vectorised``: the cohort at once with ``torch.func``)."""
    x_all, y_all = (t.to(device) for t in dm.train_tensors())
    x_test, y_test = (torch.cat(parts).to(device) for parts in zip(*dm.test_dataloader(), strict=True))
    model = model_of(w, dm).to(device)
    names = [n for n, _ in model.named_parameters()]
    gen = torch.Generator().manual_seed(1)
    times = []
    for _ in range(rounds + 1):
        synchronize(device)
        started = time.perf_counter()
        cohort = torch.randperm(w.clients, generator=gen)[: w.per_round]
        perms = torch.argsort(torch.rand(w.per_round, w.per_client, generator=gen), dim=1)
        index = (perms + (cohort * w.per_client).unsqueeze(1)).to(device)  # (K, n) into the training set
        params = {n: p.detach() for n, p in model.named_parameters()}
        if vectorised:
            new = vmap_cohort(model, params, x_all, y_all, index, w.batch)
            update = {n: new[n].mean(dim=0) for n in names}  # equal clients: equal weights
        else:
            update = sequential_cohort(model, params, x_all, y_all, index, w.batch)
        with torch.no_grad():
            for n, p in model.named_parameters():
                p.copy_(update[n])
        test_pass(model, x_test, y_test)
        synchronize(device)
        times.append(time.perf_counter() - started)
    return times[1:]


def sequential_cohort(
    model: nn.Module, start: dict[str, Tensor], x: Tensor, y: Tensor, index: Tensor, batch: int
) -> dict[str, Tensor]:
    client = model
    sums = {n: torch.zeros_like(p) for n, p in start.items()}
    start = {n: p.clone() for n, p in start.items()}
    for rows in index:
        with torch.no_grad():
            for n, p in client.named_parameters():
                p.copy_(start[n])
        opt = torch.optim.SGD(client.parameters(), lr=LR)
        for idx in rows.split(batch):
            opt.zero_grad(set_to_none=True)
            nn.functional.cross_entropy(client(x[idx]), y[idx]).backward()
            opt.step()
        with torch.no_grad():
            for n, p in client.named_parameters():
                sums[n] += p
    return {n: s / len(index) for n, s in sums.items()}


def vmap_cohort(
    model: nn.Module, start: dict[str, Tensor], x: Tensor, y: Tensor, index: Tensor, batch: int
) -> dict[str, Tensor]:
    k = len(index)
    params = {n: p.unsqueeze(0).expand(k, *p.shape).clone() for n, p in start.items()}

    def loss(p: dict[str, Tensor], xb: Tensor, yb: Tensor) -> Tensor:
        return nn.functional.cross_entropy(torch.func.functional_call(model, p, (xb,)), yb)

    grad = torch.func.vmap(torch.func.grad(loss))
    for idx in index.split(batch, dim=1):
        grads = grad(params, x[idx], y[idx])
        with torch.no_grad():
            for n in params:
                params[n] -= LR * grads[n]
    return params


ARMS: dict[str, Callable[..., list[float]]] = {
    "fedlightning": fedlightning_rounds,
    "plain_sequential": functools.partial(plain_rounds, vectorised=False),
    "plain_vmap": functools.partial(plain_rounds, vectorised=True),
}


def markdown(result: dict[str, Any]) -> str:
    lines = [
        f"Device: {result['device_name']}; torch {result['torch']}; {result['repeats']} repetitions × "
        f"{result['rounds']} rounds (median s/round, the first round of each run not counted).",
        "",
        "| workload | fedlightning | plain, sequential | plain, vmap | fedlightning ÷ plain vmap | GPU target |",
        "|---|---|---|---|---|---|",
    ]
    for name, row in result["workloads"].items():
        med = row["median_s"]
        ratio = med["fedlightning"] / med["plain_vmap"]
        target = f"≤ {TARGETS[name]}" if name in TARGETS else "—"
        lines.append(
            f"| {name}{' (synthetic inputs)' if row['synthetic'] else ''} | {med['fedlightning']:.4f} | "
            f"{med['plain_sequential']:.4f} | {med['plain_vmap']:.4f} | {ratio:.2f} | {target} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--data-root", default=os.environ.get("DATA_ROOT") or os.environ.get("FEDLIGHTNING_TEST_DATA"))
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="small sizes, for a smoke run on a CPU")
    parser.add_argument("--only", default=None, help="comma-separated workload names")
    parser.add_argument("--json", required=True)
    parser.add_argument("--markdown", default=None)
    args = parser.parse_args()
    device = torch.device(args.device)
    chosen = [w for w in workloads(args.quick) if args.only is None or w.name in args.only.split(",")]
    result: dict[str, Any] = {
        "command": " ".join(sys.argv),
        "device": str(device),
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu",
        "torch": torch.__version__,
        "rounds": args.rounds,
        "repeats": args.repeats,
        "workloads": {},
    }
    for w in chosen:
        dm = datamodule(w, args.data_root)
        runs: dict[str, list[float]] = {arm: [] for arm in ARMS}
        for _ in range(args.repeats):
            for arm, fn in ARMS.items():
                runs[arm].extend(fn(w, dm, args.rounds, device))
        result["workloads"][w.name] = {
            **asdict(w),
            "seconds_per_round": runs,
            "median_s": {arm: statistics.median(times) for arm, times in runs.items()},
        }
        print(w.name, {arm: round(statistics.median(t), 4) for arm, t in runs.items()}, flush=True)
    Path(args.json).write_text(json.dumps(result, indent=2))
    table = markdown(result)
    if args.markdown:
        Path(args.markdown).write_text(table)
    print(table)


if __name__ == "__main__":
    main()
