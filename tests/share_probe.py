"""For the 2-process tests: which clients each process trained, and a method that breaks the dealing's rule."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import lightning as L
from torch import Tensor

from fedlightning.federated.hooks import FederatedCallback
from fedlightning.methods import FedAvg


class RecordShares(FederatedCallback):
    """Writes ``shares_<rank>.json`` ({round: client ids this process trained}) into the run folder."""

    def __init__(self) -> None:
        self.shares: dict[int, list[int]] = {}

    def on_client_downlink(self, trainer: L.Trainer, module: Any, round_idx: int, client_id: int, message: Any) -> None:
        self.shares.setdefault(round_idx, []).append(client_id)

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        path = Path(trainer.default_root_dir) / f"shares_{trainer.global_rank}.json"
        path.write_text(json.dumps(self.shares))


class FedAvgKeepingState(FedAvg):
    """A FedAvg subclass that stores per-client state without unsetting ``stateless_clients`` (a mistake)."""

    def on_upload_decoded(self, *, client_id: int, round_idx: int, decoded: Tensor) -> None:
        self.client_state.set(client_id, "last_upload_norm", decoded.norm().reshape(1))
