"""Per-client costs the lean round removed, each against its replacement, interleaved.

* the client optimiser from Hydra's ``_partial_`` wrapper (target checks on every call) against
  the plain ``functools.partial`` the engine resolves once per round;
* folding a float32 upload into the float64 sums through a float64 copy against in place;
* the loss and the upload's sum read with two syncs against one.

    python benchmarks/per_client_costs.py
"""

from __future__ import annotations

import functools
import math
import statistics
import time
from collections.abc import Callable

import torch
from hydra.utils import instantiate

from fedlightning.federated.module import upload_check

D = 266_610  # mnistfc


def interleaved_ms(pairs: dict[str, Callable[[], object]], reps: int = 30, inner: int = 50) -> dict[str, float]:
    """Median ms per call of each function, the functions alternating within every repetition."""
    times: dict[str, list[float]] = {name: [] for name in pairs}
    for _ in range(reps):
        for name, fn in pairs.items():
            start = time.perf_counter()
            for _ in range(inner):
                fn()
            times[name].append((time.perf_counter() - start) / inner * 1e3)
    return {name: statistics.median(t) for name, t in times.items()}


def main() -> None:
    torch.set_num_threads(1)
    node = {"_target_": "torch.optim.SGD", "_partial_": True, "lr": 0.03, "momentum": 0.9, "nesterov": True}
    hydra_factory = instantiate(node)
    plain = functools.partial(torch.optim.SGD, lr=0.03, momentum=0.9, nesterov=True)
    params = [torch.nn.Parameter(torch.zeros(s)) for s in ((300, 784), (300,), (100, 300), (100,), (10, 100), (10,))]
    sums, upload, loss = torch.zeros(D, dtype=torch.float64), torch.randn(D), torch.tensor(0.3)
    rows = [
        ("client optimiser", {"Hydra partial": lambda: hydra_factory(params), "resolved": lambda: plain(params)}),
        (
            "fold into float64 sums",
            {
                "copy then add": lambda: sums.add_(upload.to(sums), alpha=0.1),
                "in place": lambda: sums.add_(upload, alpha=0.1),
            },
        ),
        (
            "loss and upload check",
            {
                "two reads": lambda: math.isfinite(float(loss)) and bool(torch.isfinite(upload.sum())),
                "one read": lambda: upload_check(loss, upload),
            },
        ),
    ]
    for what, pair in rows:
        ms = interleaved_ms(pair)
        (a, ta), (b, tb) = ms.items()
        print(f"{what}: {a} {ta:.4f} ms, {b} {tb:.4f} ms, ratio {tb / ta:.3f}")


if __name__ == "__main__":
    main()
