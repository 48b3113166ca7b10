"""Checkpoints that a killed run can resume from exactly, written atomically, read safely.

* :class:`AtomicCheckpointIO` writes a checkpoint to a temporary file in the same folder and
  renames it into place (``os.replace``), so a kill during the write leaves the previous file
  intact; it always reads with ``torch.load(weights_only=True)``: tensors and plain containers
  only, so a crafted file cannot run code, whatever ``TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD`` says.
* :class:`RoundCheckpoint` saves ``round-NNNN.ckpt`` every ``every`` rounds and ``last.ckpt``
  (the latest checkpoint, and the final state). A round that is evaluated is saved *after* its
  validation, so the checkpoint holds the round's score (``val/acc_best`` included) and every
  row the loggers wrote for it; the final round is always evaluated inside ``fit``.
"""

from __future__ import annotations

import contextlib
import logging
import os
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.fabric.utilities.types import _PATH
from lightning.pytorch.callbacks import Checkpoint
from lightning.pytorch.plugins.io import TorchCheckpointIO
from lightning.pytorch.trainer.states import TrainerFn
from typing_extensions import override

log = logging.getLogger("fedlightning")

CHECKPOINT_FORMAT = 1
"""Version of the ``fedlightning`` entry of a checkpoint (its config and metrics)."""
LAST = "last.ckpt"


def round_checkpoint_name(round_idx: int) -> str:
    """The file name of the checkpoint taken after ``round_idx`` rounds.

    >>> round_checkpoint_name(10)
    'round-0010.ckpt'
    """
    return f"round-{round_idx:04d}.ckpt"


def atomic_torch_save(obj: Any, path: str | Path) -> None:
    """``torch.save`` to a temporary file next to ``path``, flushed to disk, then renamed onto it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with tmp.open("wb") as handle:
            torch.save(obj, handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except (OSError, RuntimeError) as exc:  # a full disk or a read-only folder: the OSError, naming the checkpoint
        failure = exc if isinstance(exc, OSError) else exc.__context__  # torch's writer wraps it in a RuntimeError
        if not isinstance(failure, OSError):
            raise
        if failure.filename is None or failure.filename == str(tmp):
            failure.filename = str(path)
        if failure is exc:
            raise
        raise failure from exc
    finally:
        with contextlib.suppress(OSError):  # a read-only folder, where it could not be made either
            tmp.unlink(missing_ok=True)
    _fsync_dir(path.parent)


def _fsync_dir(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:  # not every platform opens folders
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def safe_torch_load(path: str | Path, map_location: Any = "cpu") -> Any:
    """``torch.load`` restricted to tensors and plain containers (``weights_only=True``, explicitly)."""
    with Path(path).open("rb") as handle:
        return torch.load(handle, map_location=map_location, weights_only=True)


class AtomicCheckpointIO(TorchCheckpointIO):
    """Lightning's checkpoint IO with atomic local writes and weights-only reads."""

    @override
    def save_checkpoint(self, checkpoint: dict[str, Any], path: _PATH, storage_options: Any | None = None) -> None:
        if storage_options is not None:
            raise TypeError(f"{type(self).__name__} takes no storage_options (got {storage_options!r}).")
        atomic_torch_save(checkpoint, path)

    @override
    def load_checkpoint(self, path: _PATH, map_location: Any | None = None, weights_only: bool | None = None) -> Any:
        # weights_only is True whatever the caller asks: checkpoints hold tensors and plain containers.
        return safe_torch_load(path, map_location=map_location if map_location is not None else "cpu")


class RoundCheckpoint(Checkpoint):
    """Saves the run after whole rounds: ``round-NNNN.ckpt`` every ``every`` rounds and ``last.ckpt``.

    A round that is evaluated is saved at the end of its validation, one that is not right after
    its training step; the last round is always evaluated (the callback asks the trainer to stop
    there, which makes Lightning validate it inside ``fit``) and saved at the end of training.
    Each checkpoint records, under the ``fedlightning`` key, the run's config and the scalar
    metrics seen so far, so a run resumed from its final checkpoint still reports them.

    Args:
        dirpath: the folder of the checkpoints.
        every: save ``round-NNNN.ckpt`` every ``every`` rounds (0: only ``last.ckpt`` at the end).
        eval_every: the validation interval of the trainer, in rounds.
        config: the run's config (plain containers) recorded in each checkpoint.
    """

    def __init__(
        self, *, dirpath: str | Path, every: int, eval_every: int, config: dict[str, Any] | None = None
    ) -> None:
        if every < 0:
            raise ValueError(f"checkpoint_every must be 0 (only the final checkpoint) or more (got {every}).")
        if eval_every < 1:
            raise ValueError(f"eval_every must be at least 1 (got {eval_every}).")
        self.dirpath = Path(dirpath)
        self.every = every
        self.eval_every = eval_every
        self.config = config or {}

    def _evaluated(self, trainer: L.Trainer, step: int) -> bool:
        return step % self.eval_every == 0 or step == trainer.max_steps

    def _due(self, step: int) -> bool:
        return self.every > 0 and step % self.every == 0

    @override
    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        step = trainer.global_step
        if step == trainer.max_steps and step % self.eval_every != 0:
            trainer.should_stop = True  # Lightning then validates this last round inside fit
        if self._due(step) and not self._evaluated(trainer, step):
            self._save(trainer, step)

    @override
    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.sanity_checking or trainer.state.fn != TrainerFn.FITTING:
            return
        step = trainer.global_step
        if self._due(step) and step != trainer.max_steps:
            self._save(trainer, step)

    @override
    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # The final round is saved once the loop has closed its epoch: a run resumed from it has
        # nothing left to train and logs its test at the step the uninterrupted run does.
        if trainer.global_step == trainer.max_steps:
            self._save(trainer, trainer.global_step)

    def _save(self, trainer: L.Trainer, step: int) -> None:
        last = self.dirpath / LAST
        if self._due(step):
            path = self.dirpath / round_checkpoint_name(step)
            trainer.save_checkpoint(path, weights_only=False)
            if trainer.is_global_zero:
                _link_or_copy(path, last)
        else:
            trainer.save_checkpoint(last, weights_only=False)

    @override
    def on_save_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict[str, Any]) -> None:
        checkpoint["fedlightning"] = {
            "format": CHECKPOINT_FORMAT,
            "config": self.config,
            "metrics": scalar_metrics(trainer.callback_metrics),
        }


def scalar_metrics(metrics: dict[str, Any]) -> dict[str, float]:
    """The one-element tensors and numbers of ``metrics`` as floats."""
    out: dict[str, float] = {}
    for name, value in metrics.items():
        one_element = isinstance(value, torch.Tensor) and value.numel() == 1
        if one_element or (isinstance(value, int | float) and not isinstance(value, bool)):
            out[name] = float(value)
    return out


def _link_or_copy(source: Path, target: Path) -> None:
    """Make ``target`` a copy of ``source`` atomically (a hard link where the file system has them)."""
    tmp = target.with_name(f".{target.name}.tmp-{os.getpid()}")
    tmp.unlink(missing_ok=True)
    try:
        try:
            os.link(source, tmp)
        except OSError:
            import shutil

            shutil.copyfile(source, tmp)
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)
