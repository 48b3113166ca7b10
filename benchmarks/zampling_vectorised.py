"""Seconds of one Federated Zampling round: the loop backend against the vectorised one (arXiv 2503.14246).

    python benchmarks/zampling_vectorised.py [--device cuda] [--rounds 5] [--warmup 1] [--json out.json]

The S1 shape: MNIST (``$FEDLIGHTNING_TEST_DATA`` or ``--data-root``, default /work/shared/data),
10 IID clients, the ``mnistfc`` model (784-300-100-10, m = 266,610), m/n = 32 (n = 8,331),
d = 10, batch 32, one local epoch, Adam lr 0.1, full participation, no evaluation. For each
backend (``--backends``, default ``loop,vectorised``) one Trainer on ``--device`` trains
``--warmup`` + ``--rounds`` rounds (round indices 0, 1, …, so every backend sees the same
rounds: the same masks and p, up to float rounding) and each round's training step is timed
(the device synchronised at its end). It prints the median round of each backend and the ratio
loop / vectorised, and with ``--json`` writes them, every round's time and the settings.

``loop`` trains the clients one after another through autograd; ``vectorised`` trains the
cohort at once (:mod:`fedlightning.methods.zampling_stacked`). Both draw each client's masks
from its own stream on the CPU. On a CPU torch runs one thread unless ``--threads`` says otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from pathlib import Path
from typing import Any

import lightning as L
import torch
from perf.trainers import bare_trainer  # benchmarks/ is sys.path[0]

from fedlightning.datamodules import IIDPartition, MNISTDataModule
from fedlightning.methods.zampling import Zampling
from fedlightning.models import build_model
from fedlightning.sampling import FullParticipation


class _RoundTimer(L.Callback):
    """Wall seconds of each training step (one federated round), the device synchronised at its end."""

    def __init__(self, device: str) -> None:
        self.device = device
        self.times: list[float] = []
        self._start = 0.0

    def _sync(self) -> None:
        if self.device.startswith("cuda"):
            torch.cuda.synchronize()

    def on_train_batch_start(self, *args: object) -> None:
        self._sync()
        self._start = time.perf_counter()

    def on_train_batch_end(self, *args: object) -> None:
        self._sync()
        self.times.append(time.perf_counter() - self._start)


def time_backend(dm: MNISTDataModule, args: argparse.Namespace, backend: str) -> tuple[list[float], Zampling]:
    """Every round's seconds of Federated Zampling on ``backend``, and the trained module."""
    torch.manual_seed(0)
    module = Zampling(
        model=build_model("mnistfc", input_shape=(1, 28, 28), num_classes=10),
        datamodule=dm,
        d=args.d,
        compression=args.compression,
        batch_size=args.batch,
        local_epochs=args.local_epochs,
        local_execution=backend,
    )
    timer = _RoundTimer(args.device)
    accelerator = "gpu" if args.device.startswith("cuda") else args.device
    trainer = bare_trainer(
        callbacks=[FullParticipation(), timer], rounds=args.warmup + args.rounds, accelerator=accelerator
    )
    trainer.fit(module)
    assert module.local_runner.name == backend, (module.local_runner.name, backend)
    return timer.times, module


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    default_root = os.environ.get("FEDLIGHTNING_TEST_DATA", "/work/shared/data")
    parser.add_argument("--data-root", default=default_root)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--backends", default="loop,vectorised", help="comma-separated local_execution values")
    parser.add_argument("--rounds", type=int, default=5, help="timed rounds per backend (the median is reported)")
    parser.add_argument("--warmup", type=int, default=1, help="untimed rounds first (one-time costs)")
    parser.add_argument("--clients", type=int, default=10)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--compression", type=float, default=32)
    parser.add_argument("--d", type=int, default=10)
    parser.add_argument("--local-epochs", type=int, default=1)
    parser.add_argument("--json", type=Path, default=None, help="write the results here")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: 1 on a CPU)")
    args = parser.parse_args()
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    if args.threads is not None or args.device == "cpu":
        torch.set_num_threads(args.threads or 1)  # more threads than free cores spin in every small op
    dm = MNISTDataModule(root=args.data_root, num_clients=args.clients, partition=IIDPartition(), seed=0)
    dm.setup("fit")
    backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    times: dict[str, list[float]] = {}
    final_p: dict[str, torch.Tensor] = {}
    for backend in backends:
        rounds, module = time_backend(dm, args, backend)
        times[backend] = rounds[args.warmup :]
        final_p[backend] = module.p.detach().cpu()
        print(
            f"{backend:11s} median {statistics.median(times[backend]):.3f} s per round on {args.device} "
            f"(rounds: {', '.join(f'{t:.3f}' for t in times[backend])})",
            flush=True,
        )
    medians = {name: statistics.median(t) for name, t in times.items()}
    result: dict[str, Any] = {
        "device": args.device,
        "device_name": torch.cuda.get_device_name() if args.device.startswith("cuda") else platform.processor(),
        "torch_threads": torch.get_num_threads(),
        "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "client_sizes": list(dm.client_sizes),
        "round_seconds": times,
        "median_round_seconds": medians,
    }
    if "loop" in medians and "vectorised" in medians:
        ratio = medians["loop"] / medians["vectorised"]
        result["loop_over_vectorised"] = ratio
        result["same_final_p"] = bool(torch.equal(final_p["loop"], final_p["vectorised"]))
        print(f"loop / vectorised: {ratio:.2f} on {args.device}; same final p: {result['same_final_p']}")
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
