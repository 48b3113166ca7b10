"""Engine overhead: a FedAvg round through fedlightning vs the same work as a plain loop.

Both sides train the same model on the same client tensors with the same batch schedule
(10 IID clients on MNIST, 1 local epoch, batch 32, one torch thread); the engine adds the
Lightning round, message encoding/decoding, accounting and callbacks. Prints the median
round time of each over several rounds and their ratio (timings on a shared machine are
noisy: compare the ratio, not the absolute times).

    python benchmarks/fedavg_round.py --data-root ../shared/data --rounds 5
"""

from __future__ import annotations

import argparse
import statistics
import time

import lightning as L
import torch

from fedlightning.datamodules import IIDPartition, MNISTDataModule
from fedlightning.federated.batches import local_batches
from fedlightning.federated.params import assign_flat_, flat_parameters
from fedlightning.federated.rng import torch_generator
from fedlightning.methods import FedAvg
from fedlightning.models import build_model
from fedlightning.sampling import FullParticipation


def plain_round(model: torch.nn.Module, client: torch.nn.Module, dm: MNISTDataModule, round_idx: int) -> None:
    """FedAvg round written directly in PyTorch (the baseline)."""
    w = flat_parameters(model)
    total = torch.zeros_like(w)
    n = 0
    for cid in range(dm.num_clients):
        assign_flat_(client, w)
        opt = torch.optim.SGD(client.parameters(), lr=0.03, momentum=0.9, nesterov=True)
        x, y = dm.client_tensors(cid)
        gen = torch_generator(seed=0, round_idx=round_idx, client_id=cid, purpose="batches")
        for idx in local_batches(num_samples=len(y), batch_size=32, epochs=1, steps=None, generator=gen):
            opt.zero_grad(set_to_none=True)
            torch.nn.functional.cross_entropy(client(x[idx]), y[idx]).backward()
            opt.step()
        total += len(y) * (flat_parameters(client) - w)
        n += len(y)
    assign_flat_(model, w + total / n)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-root", required=True)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(1)
    dm = MNISTDataModule(root=args.data_root, num_clients=10, partition=IIDPartition())
    dm.setup("fit")
    model = build_model("mnistfc", input_shape=(1, 28, 28), num_classes=10)

    plain_times = []
    client = build_model("mnistfc", input_shape=(1, 28, 28), num_classes=10)
    for r in range(args.rounds):
        start = time.perf_counter()
        plain_round(model, client, dm, r)
        plain_times.append(time.perf_counter() - start)

    module = FedAvg(
        model=build_model("mnistfc", input_shape=(1, 28, 28), num_classes=10),
        datamodule=dm,
        client_optimizer=lambda p: torch.optim.SGD(p, lr=0.03, momentum=0.9, nesterov=True),
    )
    round_times: list[float] = []

    class Timer(L.Callback):
        def on_train_batch_start(self, *args: object) -> None:
            self.start = time.perf_counter()

        def on_train_batch_end(self, *args: object) -> None:
            round_times.append(time.perf_counter() - self.start)

    trainer = L.Trainer(
        max_steps=args.rounds,
        limit_val_batches=0,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[FullParticipation(), Timer()],
    )
    trainer.fit(module)
    plain, ours = statistics.median(plain_times), statistics.median(round_times)
    print(f"plain PyTorch FedAvg round: median {plain:.3f} s over {args.rounds} rounds")
    print(f"fedlightning FedAvg round:  median {ours:.3f} s over {args.rounds} rounds")
    print(f"ratio fedlightning / plain: {ours / plain:.3f}")


if __name__ == "__main__":
    main()
