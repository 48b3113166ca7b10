"""The suite's clock inside a fedlightning run, added as ``+callbacks.bench_clock._target_=...``.

Start-up ends when the first round starts; a round ends when its central evaluation (the test
set, ``data.val_fraction=0``) ends; the result line is printed after the final test.
"""

from __future__ import annotations

import sys
from pathlib import Path

import lightning as L

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import Clock


class BenchClock(L.Callback):
    """Records the suite's timings of a fedlightning run (rank 0 prints them)."""

    def __init__(self) -> None:
        self.clock = Clock()

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch: object, idx: int) -> None:
        self.clock.first_round()

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.sanity_checking or trainer.state.fn != "fit":  # the round evaluations of fit only
            return
        metrics = trainer.callback_metrics
        acc = metrics.get("val/acc")
        self.clock.evaluated(float(acc) if acc is not None else float("nan"))

    def on_test_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.global_rank == 0:
            acc = trainer.callback_metrics.get("test/acc")
            self.clock.accs.append(float(acc) if acc is not None else float("nan"))
            self.clock.emit()
