"""Zampling speed (arXiv 2503.14246): a training step and a federated round against FedAvg.

Part 1, one local step of the 784-300-100-10 MLP (mnistfc) at batch 128, forward + backward +
optimiser step, one torch thread:

* plain: the MLP with its own weights, SGD;
* zampling: sample z ~ Bernoulli(clip(s)), w = Q·z (incremental when few bits flipped),
  functional forward, masked backward Qᵀ·g, Adam on s; m/n = 32, d = 10; measured with p as
  at round 0 (p ~ U(0,1), nothing frozen) and as after ~10 federated rounds (80% of p
  exactly 0 or 1, the rest on the 1/10 lattice).

Part 2, one federated round through the engine (10 IID MNIST clients, ~5,400 samples each,
1 local epoch): FedAvg (batch 32, its default) against Federated Zampling (batch 128, the
paper's; and batch 32), from the round-0 state and after warm-up rounds.

    python benchmarks/zampling_speed.py --data-root ../shared/data --rounds 4

Timings on a shared machine are noisy: compare the ratios printed at the end.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import lightning as L
import torch

from fedlightning.datamodules import IIDPartition, MNISTDataModule
from fedlightning.methods import FedAvg
from fedlightning.methods.zampling import Zampling, probability_from_score
from fedlightning.models import build_model
from fedlightning.models.zampling import ZampledNetwork, ZampledWeights, row_fan_in, zampling_q
from fedlightning.sampling import FullParticipation


def _interleaved_median_ms(fns: dict[str, Any], repeats: int) -> dict[str, float]:
    """Median ms of each function, timed in turn within every repetition.

    Interleaving makes the ratios robust to the load drifting on a shared machine (each
    repetition sees about the same contention for every function).
    """
    for _ in range(5):
        for fn in fns.values():
            fn()
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    return {name: 1e3 * statistics.median(t) for name, t in times.items()}


def step_benchmark(repeats: int) -> dict[str, float]:
    """Median ms of one training step: plain MLP vs Zampling (fresh and polarised p)."""
    gen = torch.Generator().manual_seed(0)
    x, y = torch.randn(128, 1, 28, 28, generator=gen), torch.randint(0, 10, (128,), generator=gen)
    model = build_model("mnistfc", input_shape=(1, 28, 28), num_classes=10)
    sgd = torch.optim.SGD(model.parameters(), lr=0.03, momentum=0.9, nesterov=True)

    def plain() -> None:
        sgd.zero_grad(set_to_none=True)
        torch.nn.functional.cross_entropy(model(x), y).backward()
        sgd.step()

    fns: dict[str, Any] = {"plain_ms": plain}
    all_weights: dict[str, ZampledWeights] = {}
    q = zampling_q(row_fan_in(model), n=266_610 // 32, d=10, seed=0)
    net = ZampledNetwork(model)
    for label, frozen_share in (("zampling_fresh_ms", 0.0), ("zampling_polarised_ms", 0.8)):
        p0 = torch.rand(q.n, generator=gen)
        if frozen_share:
            p0 = torch.round(p0 * 10) / 10
            p0 = torch.where(torch.rand(q.n, generator=gen) < frozen_share, torch.round(p0), p0)
        s = p0.clone().requires_grad_(True)
        adam = torch.optim.Adam([s], lr=0.1 if not frozen_share else 1e-4)
        weights = ZampledWeights(q)
        mask_gen = torch.Generator().manual_seed(1)

        def step(
            s: torch.Tensor = s,
            adam: torch.optim.Optimizer = adam,
            weights: ZampledWeights = weights,
            mask_gen: torch.Generator = mask_gen,
        ) -> None:
            p = probability_from_score(s, "zampling")
            w = weights(p, torch.bernoulli(p.detach(), generator=mask_gen))
            loss = torch.nn.functional.cross_entropy(net.forward(x, w), y)
            adam.zero_grad(set_to_none=True)
            loss.backward()
            adam.step()

        fns[label] = step
        all_weights[label] = weights
    results = _interleaved_median_ms(fns, repeats)
    for label, weights in all_weights.items():
        results[label.replace("_ms", "_incremental_share")] = weights.stats["incremental"] / max(
            1, weights.stats["incremental"] + weights.stats["full"]
        )
    return results


class _Timer(L.Callback):
    def __init__(self) -> None:
        self.times: list[float] = []

    def on_train_batch_start(self, *args: object) -> None:
        self.start = time.perf_counter()

    def on_train_batch_end(self, *args: object) -> None:
        self.times.append(time.perf_counter() - self.start)


def _round_times(module: L.LightningModule, rounds: int) -> list[float]:
    timer = _Timer()
    trainer = L.Trainer(
        max_steps=rounds,
        limit_val_batches=0,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[FullParticipation(), timer],
    )
    trainer.fit(module)
    return timer.times


def round_benchmark(data_root: str, rounds: int) -> dict[str, Any]:
    """Round times (s) of FedAvg and Federated Zampling through the engine."""
    dm = MNISTDataModule(root=data_root, num_clients=10, partition=IIDPartition())
    dm.setup("fit")

    def mnistfc() -> torch.nn.Module:
        return build_model("mnistfc", input_shape=(1, 28, 28), num_classes=10)

    out: dict[str, Any] = {}
    fedavg = FedAvg(
        model=mnistfc(),
        datamodule=dm,
        client_optimizer=lambda p: torch.optim.SGD(p, lr=0.03, momentum=0.9, nesterov=True),
    )
    out["fedavg_b32"] = _round_times(fedavg, rounds)
    for batch in (128, 32):
        zampling = Zampling(model=mnistfc(), datamodule=dm, d=10, compression=32, batch_size=batch)
        out[f"zampling_b{batch}"] = _round_times(zampling, rounds)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-root", required=True)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=100)
    args = parser.parse_args()
    torch.set_num_threads(1)
    steps = step_benchmark(args.repeats)
    print(f"plain mnistfc step, batch 128:           {steps['plain_ms']:.2f} ms")
    for kind in ("fresh", "polarised"):
        ms = steps[f"zampling_{kind}_ms"]
        share = steps[f"zampling_{kind}_incremental_share"]
        print(
            f"zampling step ({kind:9s}) m/n=32 d=10: {ms:.2f} ms  ratio {ms / steps['plain_ms']:.2f}x"
            f"  (incremental Q·z on {100 * share:.0f}% of steps)"
        )
    if args.rounds < 1:  # --rounds 0: the step benchmark only
        return
    rounds = round_benchmark(args.data_root, args.rounds)
    base = statistics.median(rounds["fedavg_b32"])
    print(f"FedAvg round (batch 32): median {base:.2f} s  all {[round(t, 2) for t in rounds['fedavg_b32']]}")
    for key in ("zampling_b128", "zampling_b32"):
        times = rounds[key]
        print(
            f"Federated Zampling round ({key[-4:]}): first {times[0]:.2f} s, median {statistics.median(times):.2f} s, "
            f"last {times[-1]:.2f} s  ratio(median) {statistics.median(times) / base:.2f}x  "
            f"all {[round(t, 2) for t in times]}"
        )


if __name__ == "__main__":
    main()
