"""The round's row: every per-round scalar of a run, handed to the loggers in one call.

A round ends with about twenty numbers (training loss, round time, bits on each link, method
and callback metrics), all known once the server has stepped. ``LightningModule.log`` would
store each in Lightning's result collection, which moves and deep-copies the metric's
metadata on every call; for small rounds that bookkeeping is a large share of the round
(``benchmarks/round_row.py``). The row needs none of it: no accumulation over batches, no
reduction across processes (the engine reduces first). :func:`log_round_row` therefore does
what Lightning's logger connector does with a step's values, once per round: it writes them
to ``trainer.callback_metrics`` (read by checkpoints, the run summary and the progress bar)
and passes them to every logger at the cadence ``Trainer(log_every_n_steps=...)`` sets.
"""

from __future__ import annotations

import numbers
from collections.abc import Collection, Mapping

import lightning as L
import torch
from torch import Tensor

#: The names the progress bar shows, as ``self.log(..., prog_bar=True)`` would mark them.
PROGRESS_BAR_NAMES = ("round", "comm/bits_total")


def round_row_values(row: Mapping[str, float | int | Tensor]) -> dict[str, float]:
    """The row's values as Python floats (exact for bit counts below 2^53).

    >>> round_row_values({"comm/uplink_bits": 533184, "train/loss": torch.tensor(0.5)})
    {'comm/uplink_bits': 533184.0, 'train/loss': 0.5}
    """
    values: dict[str, float] = {}
    for name, value in row.items():
        if isinstance(value, Tensor) and value.numel() != 1:
            raise ValueError(f"The round metric {name!r} has {value.numel()} elements; a round row holds scalars.")
        if not isinstance(value, (Tensor, numbers.Real)):
            raise TypeError(f"The round metric {name!r} is a {type(value).__name__}; a round row holds numbers.")
        values[name] = float(value)
    return values


def log_round_row(
    trainer: L.Trainer,
    round_idx: int,
    row: Mapping[str, float | int | Tensor],
    *,
    prog_bar: Collection[str] = PROGRESS_BAR_NAMES,
) -> None:
    """Publish round ``round_idx``'s row (0-based) as ``self.log(name, value, on_step=True)`` would.

    Every value lands in ``trainer.callback_metrics`` (as a float64 tensor) and the names in
    ``prog_bar`` in ``trainer.progress_bar_metrics``. When Lightning would have logged the step
    (every ``log_every_n_steps``-th round, or when the trainer stops) the row also goes to
    ``trainer.logged_metrics`` and to each logger, with ``epoch`` added, at step ``round_idx``.
    """
    values = round_row_values(row)
    if not values:
        return
    tensors = {name: torch.tensor(value, dtype=torch.float64) for name, value in values.items()}
    trainer.callback_metrics.update(tensors)
    trainer.progress_bar_metrics.update({name: values[name] for name in prog_bar if name in values})
    every = trainer.log_every_n_steps  # type: ignore[attr-defined]  # set by Trainer.__init__
    if not trainer.loggers or every == 0 or ((round_idx + 1) % every and not trainer.should_stop):
        return
    trainer.logged_metrics.update(tensors)
    payload = {**values, "epoch": trainer.current_epoch}
    for logger in trainer.loggers:
        logger.log_metrics(payload, step=round_idx)
        logger.save()
