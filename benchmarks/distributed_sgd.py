"""Distributed SGD with compressed gradients, as in the thesis's chapters 2, 4 and 5 (arXiv 2207.00392).

``n`` workers hold equal IID shards; every step each computes a mini-batch gradient at the
shared ``x``, compresses it with an operator of :mod:`fedlightning.compression` (per parameter
tensor, the authors' convention) and sends it; the master averages the decoded vectors and,
with ``--master <op>``, broadcasts ``C_M`` of the aggregate (Algorithm 1: no memory, every node
applies the same decoded step). Error feedback (Algorithm 4/6) compresses ``e_i + η g_i`` and
keeps what was dropped. Bits are those of the messages themselves (``message.num_bits``).

Two workloads:

* ``mnist``: the thesis's MNIST network (two fully connected layers with ReLU, 784-h-10, h = 64
  by default to fit a shared CPU),
  4 workers, batch 32 per worker, plain SGD; test accuracy against uplink bits.
* ``digits``: ℓ2-regularised multinomial logistic regression on scikit-learn's digits (the
  whole 1,797 images, 4 workers, full local gradients: compressed gradient descent); the
  suboptimality ``f(x) − f*`` against uplink bits, ``f*`` from L-BFGS.

    python benchmarks/distributed_sgd.py mnist --data-root ../shared/data --epochs 1 \\
        --ops none natural top_k_ef induced --out outputs/dsgd/mnist.jsonl
    python benchmarks/distributed_sgd.py digits --steps 300 --out outputs/dsgd/digits.jsonl
    python benchmarks/distributed_sgd.py mnist --data-root ../shared/data --validation 10000 \\
        --lr 0.03 0.1 0.3 --ops top_k_ef induced --out outputs/dsgd/mnist_tuning.jsonl

With ``--validation N`` the last ``N`` images of the seeded permutation of the training set are
held out (validation accuracy is recorded next to the test accuracy, for choosing a step size
on validation and reporting it on test); ``--lr`` takes several step sizes and ``--seeds`` several
seeds (``benchmarks/distributed_sgd_seeds.py`` summarises them). A run whose vector to compress
stops being finite records ``diverged: true`` and ends.

Each run appends one JSON line per evaluation: workload, operator, step, uplink/downlink bits
so far and the metric.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import Tensor, nn

from fedlightning.compression import (
    Blockwise,
    Compressor,
    GradientSparsification,
    Identity,
    InducedCompressor,
    NaturalCompression,
    NaturalDithering,
    RandK,
    StandardDithering,
    TernGrad,
    TopK,
    TopKThen,
)
from fedlightning.federated.params import assign_flat_, flat_parameters


@dataclass(frozen=True)
class Scheme:
    """An uplink operator and whether the workers keep error-feedback memory."""

    build: Callable[[float], Compressor]
    error_feedback: bool = False


def schemes(density: float) -> dict[str, Scheme]:
    """The compared uplink schemes; sparsifiers keep ``density`` of each tensor (equal budgets)."""
    half = density / 2
    return {
        "none": Scheme(lambda h: Identity()),
        "natural": Scheme(lambda h: NaturalCompression()),
        "natural_dithering": Scheme(lambda h: NaturalDithering(p=2, s=8)),
        "standard_dithering": Scheme(lambda h: StandardDithering(p=2, s=128)),
        "terngrad": Scheme(lambda h: TernGrad()),
        "terngrad_ef": Scheme(lambda h: TernGrad(), error_feedback=True),
        "top_k": Scheme(lambda h: TopK(fraction=h)),
        "top_k_ef": Scheme(lambda h: TopK(fraction=h), error_feedback=True),
        "rand_k": Scheme(lambda h: RandK(fraction=h)),
        "rand_k_ef": Scheme(lambda h: RandK(fraction=h), error_feedback=True),
        "grad_spars": Scheme(lambda h: GradientSparsification(fraction=h)),
        "grad_spars_ef": Scheme(lambda h: GradientSparsification(fraction=h), error_feedback=True),
        "induced": Scheme(lambda h: InducedCompressor(TopK(fraction=half), GradientSparsification(fraction=half))),
        "top_k_natural_ef": Scheme(
            lambda h: TopKThen(NaturalDithering(p=math.inf, s=2), fraction=h), error_feedback=True
        ),
    }


def flat_grad(model: nn.Module) -> Tensor:
    return torch.cat([p.grad.reshape(-1) for p in model.parameters()])  # type: ignore[union-attr]


def add_flat_(model: nn.Module, step: Tensor) -> None:
    """x ← x + step on the model's flat parameter vector."""
    x = flat_parameters(model)
    assign_flat_(model, x + step.to(x.dtype))


class DivergedError(Exception):
    """A worker's vector to compress (step plus memory) is no longer finite."""


class Workers:
    """``n`` workers' compression state: operator, error memories, generators, bit counters."""

    def __init__(self, op: Compressor, sizes: list[int], n: int, error_feedback: bool, seed: int) -> None:
        self.op = Blockwise(op, sizes) if len(sizes) > 1 else op
        self.ef = error_feedback
        self.memory = [torch.zeros(sum(sizes)) for _ in range(n)]
        self.gens = [torch.Generator().manual_seed(seed * 1000 + i) for i in range(n)]
        self.bits = 0

    def send(self, i: int, step: Tensor) -> Tensor:
        """Worker ``i`` sends ``step`` (= −η g_i); returns what the master decodes."""
        v = self.memory[i] + step if self.ef else step
        if not bool(torch.isfinite(v).all()):
            raise DivergedError(f"worker {i}: the vector to compress is not finite")
        message = self.op.compress(v, self.gens[i])
        self.bits += message.num_bits
        decoded = message.decode()
        if self.ef:
            self.memory[i] = v - decoded
        return decoded


def run_mnist(args: argparse.Namespace, name: str, scheme: Scheme, out: Path) -> None:
    from fedlightning.datamodules.mnist import read_idx

    raw = Path(args.data_root) / "MNIST" / "raw"
    xtr = torch.from_numpy(read_idx(raw / "train-images-idx3-ubyte").astype(np.float32) / 255.0).reshape(-1, 784)
    ytr = torch.from_numpy(read_idx(raw / "train-labels-idx1-ubyte").astype(np.int64))
    xte = torch.from_numpy(read_idx(raw / "t10k-images-idx3-ubyte").astype(np.float32) / 255.0).reshape(-1, 784)
    yte = torch.from_numpy(read_idx(raw / "t10k-labels-idx1-ubyte").astype(np.int64))
    mean, std = 0.1307, 0.3081
    xtr, xte = (xtr - mean) / std, (xte - mean) / std

    def build() -> nn.Module:
        return nn.Sequential(nn.Linear(784, args.hidden), nn.ReLU(), nn.Linear(args.hidden, 10))

    train_classifier(args, name, scheme, out, "mnist", (xtr, ytr, xte, yte), build, lambda x: x, eval_chunk=0)


def small_cnn() -> nn.Module:
    """Three 3×3 convolution blocks (16, 32, 64 channels, ReLU, 2×2 max-pool), one linear classifier.

    33,834 parameters: a CPU-sized stand-in for the thesis's VGG11 with one linear classifier.
    """
    return nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(64 * 4 * 4, 10),
    )


def run_cifar10(args: argparse.Namespace, name: str, scheme: Scheme, out: Path) -> None:
    """CIFAR-10 from the LOSSY JPEG-quality-75 copy (``cifar10/cifar10-jpeg-q75.tar``), no augmentation."""
    from fedlightning.datamodules.cifar import CIFAR10DataModule

    dm = CIFAR10DataModule(root=args.data_root, source="jpeg", num_clients=args.workers)
    (xtr, ytr), (xte, yte) = dm._load()
    print("cifar10: LOSSY source, JPEG quality 75 (cifar10-jpeg-q75.tar), not the official pickles", flush=True)
    train_classifier(
        args, name, scheme, out, "cifar10_jpeg_q75", (xtr, ytr, xte, yte), small_cnn, dm.transform, eval_chunk=1000
    )


def train_classifier(
    args: argparse.Namespace,
    name: str,
    scheme: Scheme,
    out: Path,
    workload: str,
    data: tuple[Tensor, Tensor, Tensor, Tensor],
    build: Callable[[], nn.Module],
    prep: Callable[[Tensor], Tensor],
    *,
    eval_chunk: int,
) -> None:
    """Distributed SGD on a classifier: ``n`` IID shards, compressed steps, test accuracy against bits."""
    xtr, ytr, xte, yte = data
    torch.manual_seed(args.seed)
    model = build()
    sizes = [p.numel() for p in model.parameters()]
    n = args.workers
    perm = torch.randperm(len(ytr), generator=torch.Generator().manual_seed(args.seed))
    val_idx = perm[len(perm) - args.validation :] if args.validation else perm[:0]
    perm = perm[: len(perm) - args.validation]  # with --validation 0 the shards are the full training set's
    # the training loss on 10,000 training images: MNIST's first 10,000 (the protocol of the tables);
    # CIFAR-10's samples are ordered by class, so a random 10,000 there
    loss_idx = perm[:10000] if args.validation or workload != "mnist" else torch.arange(10000)
    shards = perm.chunk(n)
    workers = Workers(scheme.build(args.density), sizes, n, scheme.error_feedback, args.seed)
    master = Blockwise(build_master(args.master), sizes) if args.master != "none" else None
    master_gen = torch.Generator().manual_seed(args.seed * 1000 + 999)
    down_bits = 0
    steps_per_epoch = min(len(s) for s in shards) // args.batch
    loss_fn = nn.CrossEntropyLoss()
    run_keys = {
        "workload": workload,
        "op": name,
        "seed": args.seed,
        "master": args.master,
        "lr": args.lr,
        "density": args.density,
    }
    started = time.perf_counter()
    step = 0
    for epoch in range(args.epochs):
        orders = [
            s[torch.randperm(len(s), generator=torch.Generator().manual_seed(args.seed * 1_000_003 + epoch * 7 + i))]
            for i, s in enumerate(shards)
        ]
        for b in range(steps_per_epoch):
            total = torch.zeros(sum(sizes))
            try:
                for i in range(n):
                    idx = orders[i][b * args.batch : (b + 1) * args.batch]
                    model.zero_grad()
                    loss_fn(model(prep(xtr[idx])), ytr[idx]).backward()
                    total += workers.send(i, -args.lr * flat_grad(model))
            except DivergedError:
                record(
                    out,
                    **run_keys,
                    step=step + 1,
                    epoch=(step + 1) / steps_per_epoch,
                    diverged=True,
                    up_bits=workers.bits,
                    validation=args.validation,
                )
                return
            aggregate = total / n
            if master is not None:
                message = master.compress(aggregate, master_gen)
                down_bits += message.num_bits * n  # one broadcast, heard by each of the n workers
                aggregate = message.decode()
            else:
                down_bits += 32 * aggregate.numel() * n
            add_flat_(model, aggregate)
            step += 1
            last = (epoch == args.epochs - 1 and b == steps_per_epoch - 1) or step == args.max_steps
            if step % args.eval_every == 0 or last:
                with torch.no_grad():
                    acc = accuracy(model, prep, xte, yte, eval_chunk)
                    train_loss = mean_loss(model, prep, xtr[loss_idx], ytr[loss_idx], eval_chunk)
                    val_acc = accuracy(model, prep, xtr[val_idx], ytr[val_idx], eval_chunk) if len(val_idx) else None
                record(
                    out,
                    **run_keys,
                    step=step,
                    epoch=step / steps_per_epoch,
                    up_bits=workers.bits,
                    down_bits=down_bits,
                    test_acc=acc,
                    val_acc=val_acc,
                    validation=args.validation,
                    train_loss=train_loss,
                    seconds=time.perf_counter() - started,
                )
            if step == args.max_steps:
                return


def accuracy(model: nn.Module, prep: Callable[[Tensor], Tensor], x: Tensor, y: Tensor, chunk: int) -> float:
    """Top-1 accuracy, in chunks of ``chunk`` samples (0: all at once)."""
    if chunk <= 0:
        return float((model(prep(x)).argmax(1) == y).float().mean())
    hits = sum(
        int((model(prep(x[i : i + chunk])).argmax(1) == y[i : i + chunk]).sum()) for i in range(0, len(y), chunk)
    )
    return hits / len(y)


def mean_loss(model: nn.Module, prep: Callable[[Tensor], Tensor], x: Tensor, y: Tensor, chunk: int) -> float:
    """Mean cross-entropy, in chunks of ``chunk`` samples (0: all at once)."""
    if chunk <= 0:
        return float(nn.functional.cross_entropy(model(prep(x)), y))
    total = sum(
        float(nn.functional.cross_entropy(model(prep(x[i : i + chunk])), y[i : i + chunk], reduction="sum"))
        for i in range(0, len(y), chunk)
    )
    return total / len(y)


def build_master(name: str) -> Compressor:
    return {"natural": NaturalCompression(), "natural_dithering": NaturalDithering(p=2, s=8)}[name]


def run_digits(args: argparse.Namespace, name: str, scheme: Scheme, out: Path) -> None:
    from sklearn.datasets import load_digits

    x_np, y_np = load_digits(return_X_y=True)
    x = torch.from_numpy(x_np / 16.0).double()
    y = torch.from_numpy(y_np).long()
    l2 = args.l2
    model = nn.Linear(64, 10).double()
    nn.init.zeros_(model.weight)
    nn.init.zeros_(model.bias)
    sizes = [p.numel() for p in model.parameters()]

    def objective(xs: Tensor, ys: Tensor) -> Tensor:
        return nn.functional.cross_entropy(model(xs), ys) + 0.5 * l2 * sum((p * p).sum() for p in model.parameters())

    f_star = optimum(x, y, l2)
    n = args.workers
    perm = torch.randperm(len(y), generator=torch.Generator().manual_seed(args.seed))
    shards = perm.chunk(n)
    # L of each worker's objective: ½ λ_max(AᵀA/m) (softmax Hessian ≤ ½ I) + l2, bias column included
    big_l = max(
        0.5
        * float(
            torch.linalg.eigvalsh(
                torch.cat([x[s], torch.ones(len(s), 1, dtype=torch.float64)], 1).T
                @ torch.cat([x[s], torch.ones(len(s), 1, dtype=torch.float64)], 1)
                / len(s)
            )[-1]
        )
        + l2
        for s in shards
    )
    lr = args.lr if args.lr > 0 else 1.0 / big_l
    workers = Workers(scheme.build(args.density), sizes, n, scheme.error_feedback, args.seed)
    for step in range(args.steps + 1):
        if step % args.eval_every == 0 or step == args.steps:
            with torch.no_grad():
                gap = float(objective(x, y)) - f_star
            record(
                out,
                workload="digits",
                op=name,
                seed=args.seed,
                lr=lr,
                density=args.density,
                step=step,
                up_bits=workers.bits,
                suboptimality=gap,
            )
        if step == args.steps:
            break
        total = torch.zeros(sum(sizes))
        for i, s in enumerate(shards):
            model.zero_grad()
            objective(x[s], y[s]).backward()
            g = flat_grad(model).float()
            total += workers.send(i, -lr * g)
        add_flat_(model, (total / n).double())


def optimum(x: Tensor, y: Tensor, l2: float) -> float:
    """f* of the regularised multinomial logistic loss (L-BFGS, float64)."""
    model = nn.Linear(64, 10).double()
    opt = torch.optim.LBFGS(model.parameters(), lr=1, max_iter=1000, tolerance_grad=1e-14, tolerance_change=1e-16)

    def closure() -> Tensor:
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(x), y) + 0.5 * l2 * sum((p * p).sum() for p in model.parameters())
        loss.backward()
        return loss

    for _ in range(5):
        opt.step(closure)
    with torch.no_grad():
        return float(
            nn.functional.cross_entropy(model(x), y) + 0.5 * l2 * sum((p * p).sum() for p in model.parameters())
        )


def record(out: Path, **fields: object) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("a") as handle:
        handle.write(json.dumps(fields) + "\n")
    print(json.dumps(fields), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("workload", choices=["mnist", "cifar10", "digits"])
    parser.add_argument("--ops", nargs="+", default=list(schemes(0.01)))
    parser.add_argument("--density", type=float, default=0.01, help="kept fraction of each tensor (sparsifiers)")
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--hidden", type=int, default=64, help="hidden units of the MNIST network")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument(
        "--lr",
        type=float,
        nargs="+",
        default=[0.1],
        help="step size(s), each run for every operator (digits: <= 0 means 1/L)",
    )
    parser.add_argument(
        "--validation",
        type=int,
        default=0,
        help="mnist: training images held out for validation (0: none, the full set)",
    )
    parser.add_argument("--l2", type=float, default=1e-3)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--max-steps", type=int, default=0, help="mnist: stop after this many steps (0: all epochs)")
    parser.add_argument("--eval-every", type=int, default=100)
    parser.add_argument("--master", default="none", choices=["none", "natural", "natural_dithering"])
    parser.add_argument("--data-root", default="../shared/data")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--seeds", type=int, nargs="+", default=None, help="run every (lr, operator) on each seed (overrides --seed)"
    )
    parser.add_argument("--out", type=Path, default=Path("outputs/dsgd/results.jsonl"))
    args = parser.parse_args()
    torch.set_num_threads(1)
    table = schemes(args.density)
    runner = {"mnist": run_mnist, "cifar10": run_cifar10, "digits": run_digits}[args.workload]
    for seed in args.seeds if args.seeds is not None else [args.seed]:
        for lr in args.lr:
            for name in args.ops:
                one = argparse.Namespace(**{**vars(args), "lr": lr, "seed": seed})
                runner(one, name, table[name], args.out)


if __name__ == "__main__":
    main()
