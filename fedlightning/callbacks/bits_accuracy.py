"""Accuracy against the bits that crossed the wire: W&B axes, a CSV and a PNG per run."""

from __future__ import annotations

import csv
import logging
from pathlib import Path
from typing import Any

import lightning as L
from lightning.pytorch.loggers import WandbLogger
from typing_extensions import override

from fedlightning.tracking import define_bit_axes

log = logging.getLogger(__name__)

CURVE_FIELDS = ("round", "comm/uplink_bits_total", "comm/downlink_bits_total", "comm/bits_total")


def curve_title(*, method: str, data: str, partition: str, compressor: str, downlink: str = "none") -> str:
    """The title of a run's curve: what ran on which split, and what compressed its messages.

    >>> curve_title(method="fedavg", data="digits", partition="dirichlet", compressor="qsgd")
    'fedavg on digits (dirichlet split), uplink: qsgd'
    >>> curve_title(method="fedavg", data="mnist", partition="iid", compressor="none", downlink="natural")
    'fedavg on mnist (iid split), uplink: uncompressed, downlink: natural'
    """
    title = f"{method} on {data} ({partition} split), uplink: {compressor if compressor != 'none' else 'uncompressed'}"
    return title + (f", downlink: {downlink}" if downlink != "none" else "")


class BitsVsAccuracy(L.Callback):
    """Records (round, cumulative bits, val/acc) at every evaluation.

    At the end of fitting it writes ``bits_vs_accuracy.csv`` and ``bits_vs_accuracy.png``
    into ``output_dir``. With a W&B logger it declares ``comm/uplink_bits_total`` the x-axis of
    every ``val/*``, ``test/*`` and ``train/*`` metric (:func:`fedlightning.tracking.define_bit_axes`),
    so W&B charts accuracy against bits, not steps.

    Args:
        output_dir: folder for the CSV and PNG.
        title: plot title (:func:`curve_title`, e.g. "fedavg on digits (dirichlet split), uplink: qsgd").
        metric: the validation score to record (``val/acc``; ``val/r2`` for regression).
    """

    def __init__(self, *, output_dir: str | Path, title: str = "", metric: str = "val/acc") -> None:
        self.output_dir = Path(output_dir)
        self.title = title
        self.metric = metric
        self.points: list[dict[str, float]] = []

    @override
    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        for logger in trainer.loggers:
            if isinstance(logger, WandbLogger) and trainer.is_global_zero:
                define_bit_axes(logger.experiment, score=self.metric.removeprefix("val/"))

    @override
    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.sanity_checking or self.metric not in trainer.callback_metrics:
            return
        metrics = trainer.callback_metrics
        point: dict[str, float] = {"round": trainer.global_step}  # rounds done, counted from 1
        for name in (*CURVE_FIELDS[1:], self.metric):
            if name in metrics:
                point[name] = float(metrics[name])
        if self.points and self.points[-1]["round"] == point["round"]:
            self.points[-1] = point
        else:
            self.points.append(point)

    @override
    def on_fit_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.is_global_zero and self.points:
            self.write()

    def write(self) -> None:
        """Write the CSV and the PNG of the curve recorded so far."""
        self.output_dir.mkdir(parents=True, exist_ok=True)
        with (self.output_dir / "bits_vs_accuracy.csv").open("w", newline="") as handle:
            writer = csv.DictWriter(handle, fieldnames=(*CURVE_FIELDS, self.metric))
            writer.writeheader()
            writer.writerows(self.points)
        from fedlightning.plotting import plot_curves

        plot_curves(
            {
                self.title or "run": [
                    (p["comm/uplink_bits_total"], p[self.metric]) for p in self.points if "comm/uplink_bits_total" in p
                ]
            },
            self.output_dir / "bits_vs_accuracy.png",
            title=self.title,
            ylabel=self.metric,
        )

    @override
    def state_dict(self) -> dict[str, Any]:
        return {"points": list(self.points)}

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.points = list(state_dict.get("points", []))
