"""For the 2-process tests: which clients each process trained, and a method that breaks the dealing's rule."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import lightning as L
from torch import Tensor

from fedlightning.federated.cohort import Cohort
from fedlightning.federated.hooks import FederatedCallback
from fedlightning.methods import FedAvg


class RecordShares(FederatedCallback):
    """Writes ``shares_<rank>.json`` into the run folder: per round, the cohort, the method's load of
    each member (:meth:`FederatedModule.cohort_loads`) and the client ids this process trained."""

    def __init__(self) -> None:
        self.rounds: dict[int, dict[str, list[Any]]] = {}

    def on_cohort_selected(self, trainer: L.Trainer, module: Any, cohort: Cohort) -> None:
        loads = module.cohort_loads(cohort)
        self.rounds[cohort.round_idx] = {"cohort": list(cohort.client_ids), "loads": loads, "trained": []}

    def on_client_downlink(self, trainer: L.Trainer, module: Any, round_idx: int, client_id: int, message: Any) -> None:
        self.rounds[round_idx]["trained"].append(client_id)

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        path = Path(trainer.default_root_dir) / f"shares_{trainer.global_rank}.json"
        path.write_text(json.dumps(self.rounds))


class FedAvgKeepingState(FedAvg):
    """A FedAvg subclass that stores per-client state without unsetting ``stateless_clients`` (a mistake)."""

    def on_upload_decoded(self, *, client_id: int, round_idx: int, decoded: Tensor) -> None:
        self.client_state.set(client_id, "last_upload_norm", decoded.norm().reshape(1))
