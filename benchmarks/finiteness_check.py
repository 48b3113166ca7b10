"""Cost of the engine's per-upload finiteness check: one reduction against an element-wise test.

Run: ``python benchmarks/finiteness_check.py`` (one torch thread, CPU). Results are recorded in
``benchmarks/results/failures.md``.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

import torch


def per_call_ms(check: Callable[[], bool], reps: int) -> float:
    """Mean wall time of ``check()`` in milliseconds, after one warm-up call."""
    check()
    started = time.perf_counter()
    for _ in range(reps):
        check()
    return (time.perf_counter() - started) / reps * 1e3


def main() -> None:
    torch.set_num_threads(1)
    loss = torch.tensor(0.3)
    for name, d in (("mnistfc", 266_610), ("resnet18_gn", 11_200_000)):
        upload = torch.randn(d)
        reps = 200 if d < 1_000_000 else 20
        elementwise = per_call_ms(lambda u=upload: bool(torch.isfinite(loss).all() and torch.isfinite(u).all()), reps)
        reduction = per_call_ms(lambda u=upload: math.isfinite(float(loss)) and bool(torch.isfinite(u.sum())), reps)
        print(f"{name} (d={d}): isfinite(upload).all() {elementwise:.3f} ms, isfinite(upload.sum()) {reduction:.3f} ms")


if __name__ == "__main__":
    main()
