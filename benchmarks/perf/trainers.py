"""The bare Lightning ``Trainer`` the benchmark scripts time the engine under.

No logger, checkpoint, progress bar or model summary, so that a timed round is the engine's
work; one device of ``accelerator`` (``"auto"``, as Lightning's default, unless a script names it).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import lightning as L

__all__ = ["bare_trainer"]


def bare_trainer(
    *,
    callbacks: Sequence[L.Callback] = (),
    rounds: int | None = None,
    eval_every: int | None = None,
    accelerator: str = "auto",
) -> L.Trainer:
    """A quiet trainer of ``rounds`` rounds (``max_steps``), validating every ``eval_every`` rounds.

    ``eval_every=None`` fits without validation; ``rounds=None`` makes a trainer for
    ``validate`` or ``test`` alone.
    """
    fit: dict[str, Any] = {}
    if rounds is not None:
        fit["max_steps"] = rounds
        if eval_every is None:
            fit["limit_val_batches"] = 0
        else:
            fit.update(val_check_interval=eval_every, check_val_every_n_epoch=None, num_sanity_val_steps=0)
    return L.Trainer(
        accelerator=accelerator,
        devices=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=list(callbacks),
        **fit,
    )
