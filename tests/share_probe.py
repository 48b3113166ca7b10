"""A callback for the 2-process tests: which clients each process trained in each round."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import lightning as L

from fedlightning.federated.hooks import FederatedCallback


class RecordShares(FederatedCallback):
    """Writes ``shares_<rank>.json`` ({round: client ids this process trained}) into the run folder."""

    def __init__(self) -> None:
        self.shares: dict[int, list[int]] = {}

    def on_client_downlink(self, trainer: L.Trainer, module: Any, round_idx: int, client_id: int, message: Any) -> None:
        self.shares.setdefault(round_idx, []).append(client_id)

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        path = Path(trainer.default_root_dir) / f"shares_{trainer.global_rank}.json"
        path.write_text(json.dumps(self.shares))
