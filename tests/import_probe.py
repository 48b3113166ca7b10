"""A callback for the start-up tests: which optional packages a run had imported by its first round."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import lightning as L

WATCHED = ("torchvision", "matplotlib", "scipy.signal", "wandb")


class ImportsAtFirstRound(L.Callback):
    """Writes ``imports_at_first_round.json`` (the watched modules then imported) into the run folder."""

    def on_train_batch_start(self, trainer: L.Trainer, *args: Any) -> None:
        if trainer.global_step == 0:
            loaded = [name for name in WATCHED if name in sys.modules]
            Path(trainer.default_root_dir, "imports_at_first_round.json").write_text(json.dumps(loaded))
