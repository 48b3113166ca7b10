"""Per-client costs the lean round removed, each against its replacement, interleaved.

* the client optimiser from Hydra's ``_partial_`` wrapper (target checks on every call) against
  the plain ``functools.partial`` the engine resolves once per round;
* folding a float32 upload into the float64 sums through a float64 copy against in place;
* the loss and the upload's sum read with two syncs against one;
* one local step of ``mnistfc`` at batch 10 (S2) with ``zero_grad`` and ``torch.optim.SGD.step()``
  against ``clear_grads_`` and ``sgd_step_`` (the same update), next to the forward and
  backward alone (the floor both share).

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

from fedlightning.federated.local.steps import clear_grads_, sgd_step_
from fedlightning.federated.module import upload_check
from fedlightning.models import build_model

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
    model = build_model("mnistfc", input_shape=(1, 28, 28), num_classes=10)
    weights = list(model.parameters())
    sgd = torch.optim.SGD(weights, lr=0.05)
    x, y = torch.randn(10, 1, 28, 28), torch.randint(0, 10, (10,))

    def torch_step() -> None:
        sgd.zero_grad(set_to_none=True)
        torch.nn.functional.cross_entropy(model(x), y).backward()
        sgd.step()

    def engine_step() -> None:
        clear_grads_(weights)
        torch.nn.functional.cross_entropy(model(x), y).backward()
        sgd_step_(sgd)

    def forward_backward() -> None:
        clear_grads_(weights)
        torch.nn.functional.cross_entropy(model(x), y).backward()

    rows.append(("local SGD step (batch 10)", {"torch.optim step()": torch_step, "sgd_step_": engine_step}))
    rows.append(("local SGD step floor", {"torch.optim step()": torch_step, "forward+backward only": forward_backward}))
    for what, pair in rows:
        ms = interleaved_ms(pair)
        (a, ta), (b, tb) = ms.items()
        print(f"{what}: {a} {ta:.4f} ms, {b} {tb:.4f} ms, ratio {tb / ta:.3f}")


if __name__ == "__main__":
    main()
