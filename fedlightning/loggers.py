"""Loggers that number rows by round: a CSV logger that survives a resume, and a W&B logger.

Lightning's ``CSVLogger`` deletes an existing ``metrics.csv`` when it starts and rewrites the
whole file in place when a new metric appears, so a resumed run loses its history and a kill
during a rewrite loses the file. This one keeps the file it finds (``fedlightning.run`` first
cuts it back to the rounds of the checkpoint it resumes from), appends to it, and rewrites it
atomically (temporary file, then rename) when the header grows.
"""

from __future__ import annotations

import csv
import io
from pathlib import Path
from typing import Any

from lightning.fabric.loggers.logger import rank_zero_experiment
from lightning.fabric.utilities.rank_zero import rank_zero_only
from lightning.pytorch.loggers import CSVLogger as LightningCSVLogger
from lightning.pytorch.loggers import WandbLogger as LightningWandbLogger
from lightning.pytorch.loggers.csv_logs import ExperimentWriter
from typing_extensions import override

from fedlightning.run_folder import write_text_atomic


class ResumableExperimentWriter(ExperimentWriter):
    """Appends to an existing ``metrics.csv`` (keeping its columns) instead of deleting it."""

    @override
    def _check_log_dir_exists(self) -> None:
        path = Path(self.metrics_file_path)
        if path.is_file():
            with path.open(newline="") as handle:
                header = next(csv.reader(handle), [])
            self.metrics_keys = list(header)

    @override
    def save(self) -> None:
        if not self.metrics:
            return
        path = Path(self.metrics_file_path)
        new_keys = self._record_new_keys()
        if new_keys and path.is_file():
            self._rewrite_with_new_header(self.metrics_keys)
        exists = path.is_file()
        with path.open("a" if exists else "w", newline="") as handle:
            writer = csv.DictWriter(handle, fieldnames=self.metrics_keys)
            if not exists:
                writer.writeheader()
            writer.writerows(self.metrics)
        self.metrics = []

    @override
    def _rewrite_with_new_header(self, fieldnames: list[str]) -> None:
        path = Path(self.metrics_file_path)
        with path.open(newline="") as handle:
            rows = list(csv.DictReader(handle))
        text = io.StringIO()
        writer = csv.DictWriter(text, fieldnames=fieldnames)
        writer.writeheader()
        writer.writerows(rows)
        write_text_atomic(path, text.getvalue())


class CSVLogger(LightningCSVLogger):
    """Lightning's ``CSVLogger`` with a ``metrics.csv`` that a resumed run continues.

    A row that carries the ``round`` metric (every training, validation and test row of a
    federated run) is written at ``step`` = that round, counted from 1 like every file of a run
    folder; Lightning's own step counter starts at 0 and lags the round it logs by one.
    """

    @override
    @rank_zero_only
    def log_metrics(self, metrics: dict[str, Any], step: int | None = None) -> None:
        if "round" in metrics:
            step = round_number(metrics["round"])
            metrics = {**metrics, "round": step}
        super().log_metrics(metrics, step)

    @property
    @override
    @rank_zero_experiment
    def experiment(self) -> Any:
        if self._experiment is not None:
            return self._experiment
        self._fs.makedirs(self.root_dir, exist_ok=True)
        self._experiment = ResumableExperimentWriter(log_dir=self.log_dir)
        return self._experiment

    @property
    def metrics_file(self) -> Path:
        """The ``metrics.csv`` this logger writes."""
        return Path(self.log_dir) / ExperimentWriter.NAME_METRICS_FILE


class WandbLogger(LightningWandbLogger):
    """Lightning's ``WandbLogger``, logging each row at the W&B step ``trainer/global_step`` = its round.

    ``group``, ``name``, ``tags`` and ``job_type`` left ``None`` are filled in by
    :func:`fedlightning.run.run` (see :func:`fedlightning.tracking.run_labels`), which also
    logs the flattened config, the bit axes, the bits-to-target table (``accuracy_targets``)
    and the run's files.

    Args:
        project: the W&B project.
        entity: the W&B user or team (``None``: the default entity).
        group: the run's group.
        name: the run's display name.
        tags: the run's tags.
        job_type: the run's job type.
        log_model: upload checkpoints as W&B artifacts (Lightning's option).
        save_dir: the folder receiving ``wandb/`` (the run folder).
        accuracy_targets: the validation scores of the bits-to-target table.
        **kwargs: passed to ``wandb.init`` through Lightning's logger.
    """

    def __init__(
        self,
        *,
        project: str = "fedlightning",
        entity: str | None = None,
        group: str | None = None,
        name: str | None = None,
        tags: list[str] | None = None,
        job_type: str | None = None,
        log_model: bool = False,
        save_dir: str = ".",
        accuracy_targets: list[float] | tuple[float, ...] = (0.5, 0.8, 0.9),
        **kwargs: Any,
    ) -> None:
        super().__init__(
            name=name,
            save_dir=save_dir,
            project=project,
            log_model=log_model,
            entity=entity,
            group=group,
            tags=list(tags) if tags else None,
            job_type=job_type,
            **kwargs,
        )
        if self._wandb_init.get("anonymous") is None:
            self._wandb_init.pop("anonymous", None)  # W&B warns about the setting even when unset
        self.accuracy_targets = tuple(float(t) for t in accuracy_targets)

    @override
    @rank_zero_only
    def log_metrics(self, metrics: Any, step: int | None = None) -> None:
        if "round" in metrics:
            step = round_number(metrics["round"])
            metrics = {**metrics, "round": step}
        super().log_metrics(metrics, step)


def round_number(value: Any) -> int:
    """A logged ``round`` value (a float or a one-element tensor) as the integer it counts.

    >>> round_number(3.0)
    3
    """
    return round(float(value))
