"""What every system of the suite shares: MNIST as float tensors, the MLP, the evaluation, the clock.

Imported by the peer scripts in their own virtual environments (torch and numpy only), so the
data, the model initialisation and the evaluation are the same code for every system. Round time
is the time between the ends of two consecutive central evaluations; start-up is the time from
the launch (``BENCH_LAUNCH_T``, set by the harness just before it starts the process) to the
start of the first round.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import numpy as np
import torch
from torch import nn

MEAN, STD = 0.1307, 0.3081


def one_thread() -> None:
    """One intra-op thread in every process (measured fastest on 2 shared cores)."""
    for key in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ[key] = "1"
    torch.set_num_threads(1)


def _idx(path: Path) -> np.ndarray:
    raw = path.read_bytes()
    ndim = raw[3]
    shape = tuple(int.from_bytes(raw[4 + 4 * i : 8 + 4 * i], "big") for i in range(ndim))
    return np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * ndim).reshape(shape)


def load_mnist(root: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """MNIST train and test, normalised (0.1307 / 0.3081), flattened float32; int64 labels."""
    raw = Path(root) / "MNIST" / "raw"

    def images(name: str) -> torch.Tensor:
        x = torch.from_numpy(_idx(raw / name).reshape(-1, 784).astype(np.float32) / 255.0)
        return (x - MEAN) / STD

    def labels(name: str) -> torch.Tensor:
        return torch.from_numpy(_idx(raw / name).astype(np.int64))

    return (
        images("train-images-idx3-ubyte"),
        labels("train-labels-idx1-ubyte"),
        images("t10k-images-idx3-ubyte"),
        labels("t10k-labels-idx1-ubyte"),
    )


def iid_clients(num_samples: int, num_clients: int, per_client: int, seed: int) -> list[torch.Tensor]:
    """A seeded ``randperm`` cut into ``num_clients`` blocks of ``per_client`` indices."""
    perm = torch.randperm(num_samples, generator=torch.Generator().manual_seed(seed))
    return [perm[k * per_client : (k + 1) * per_client] for k in range(num_clients)]


def mlp(seed: int) -> nn.Sequential:
    """The 784-300-100-10 MLP, initialised from ``seed``."""
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(784, 300), nn.ReLU(), nn.Linear(300, 100), nn.ReLU(), nn.Linear(100, 10))


@torch.no_grad()
def evaluate(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    """Test accuracy in one forward pass over the whole test set."""
    model.eval()
    acc = float((model(x).argmax(1) == y).float().mean())
    model.train()
    return acc


def shuffle_seed(round_idx: int, client_id: int) -> int:
    """The seed of a client's shuffle in a round."""
    return 1_000_003 * round_idx + client_id


class Clock:
    """Records start-up and the end of every central evaluation; prints the result as JSON."""

    def __init__(self) -> None:
        self.launch = float(os.environ.get("BENCH_LAUNCH_T", time.time()))
        self.startup_s: float | None = None
        self.eval_ends: list[float] = []
        self.accs: list[float] = []

    def first_round(self) -> None:
        if self.startup_s is None:
            self.startup_s = time.time() - self.launch
            self.eval_ends.append(time.time())  # round 1 runs from here to the first evaluation's end

    def evaluated(self, acc: float) -> None:
        self.eval_ends.append(time.time())
        self.accs.append(acc)

    def emit(self, **extra: object) -> None:
        rounds = np.diff(self.eval_ends).tolist()
        out = {"startup_s": self.startup_s, "round_s": rounds, "test_acc": self.accs[-1] if self.accs else None}
        print("BENCH_RESULT " + json.dumps({**out, **extra}), flush=True)
        sys.stdout.flush()


_CLIENTS: dict[tuple[str, int, int, int], tuple[list[torch.Tensor], torch.Tensor, torch.Tensor]] = {}


def cached_federation(
    root: str, clients: int, per_client: int, seed: int
) -> tuple[list[torch.Tensor], torch.Tensor, torch.Tensor]:
    """``(client index blocks, x_train, y_train)``, loaded once per process (for worker processes)."""
    key = (root, clients, per_client, seed)
    if key not in _CLIENTS:
        x, y, _, _ = load_mnist(root)
        _CLIENTS[key] = (iid_clients(len(y), clients, per_client, seed), x, y)
    return _CLIENTS[key]


_MODELS: dict[int, nn.Module] = {}


def cached_model(seed: int) -> nn.Module:
    """One reused MLP per worker process."""
    if seed not in _MODELS:
        _MODELS[seed] = mlp(seed)
    return _MODELS[seed]
