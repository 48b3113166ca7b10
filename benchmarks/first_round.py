"""Start-up probe: a callback that prints the seconds from launch to the first round.

    T0=$(date +%s.%N) PYTHONPATH=benchmarks python -X importtime -c "from fedlightning.cli import main; main()" \
      rounds=1 logger=none trainer.enable_progress_bar=false +callbacks.first._target_=first_round.FirstRound

``T0`` is the launch time (seconds since the epoch) taken by the shell just before the command.
"""

from __future__ import annotations

import os
import time
from typing import Any

import lightning as L


class FirstRound(L.Callback):
    """Prints wall seconds since ``$T0`` and this process's CPU seconds when round 1 starts."""

    def on_train_batch_start(self, trainer: L.Trainer, *args: Any) -> None:
        if trainer.global_step == 0:
            launched = float(os.environ.get("T0", "nan"))
            print(f"first round: wall {time.time() - launched:.3f} s, CPU {time.process_time():.3f} s", flush=True)
