"""A callback for the 2-process tests: how many held-out samples each process evaluated."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import lightning as L


class CountHeldOut(L.Callback):
    """Writes ``held_out_<rank>.json`` (test samples this process evaluated) into the run folder."""

    def __init__(self) -> None:
        self.samples = 0

    def on_test_batch_end(
        self,
        trainer: L.Trainer,
        pl_module: L.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        self.samples += len(batch[1])

    def on_test_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        path = Path(trainer.default_root_dir) / f"held_out_{trainer.global_rank}.json"
        path.write_text(json.dumps({"samples": self.samples}))
