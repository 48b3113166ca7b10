"""Early stopping on a validation metric, counted in evaluated rounds, testing the best round.

The round engine validates every ``eval_every`` rounds (``fedlightning.run``). With
``early_stopping.monitor`` set, :class:`RoundEarlyStopping` watches that validation metric
(e.g. ``val/acc``, or ``val/acc_sampled_mean`` of the Zampling family) and stops the run once
it has not improved for ``patience`` evaluations in a row. With ``restore_best`` (the
default) the test then scores the state of the best evaluated round (the server state in
``state_dict()``, kept in memory and in every checkpoint), not the last one, and logs which
round it scored as ``test/scored_round``; without it the last round is tested and named.

The Zampling paper (arXiv 2503.14246) trains "for 100 epochs with early stopping, using 10
epochs of patience and a delta of 10^-4": for its centralised runs (one round = one epoch) that
is ``rounds=100`` with ``patience=10``, ``min_delta=1e-4`` on a held-out validation split.
Lightning's own ``EarlyStopping`` stops but leaves the test on the last weights, and its
``ModelCheckpoint`` restores through a file and the trainer's ``ckpt_path``; this callback
keeps the best state itself so that ``fedlightning.run`` needs no second test path.

A module whose evaluation depends on the round (the Zampling family draws its sampled
networks from the round's random stream) reads the round of the state it evaluates with
:func:`state_round`.
"""

from __future__ import annotations

import inspect
import logging
import math
from collections.abc import Mapping
from typing import Any, Literal

import lightning as L
import torch
from lightning.pytorch.trainer.states import TrainerFn
from torch import Tensor
from typing_extensions import override

from fedlightning.errors import ConfigError
from fedlightning.schema import close_match

__all__ = ["SCORED_ROUND_ATTRIBUTE", "RoundEarlyStopping", "early_stopping_callback", "improves", "state_round"]

log = logging.getLogger("fedlightning")

Mode = Literal["max", "min"]
SCORED_ROUND_ATTRIBUTE = "scored_round"
"""Attribute set on the module while its restored best state is tested: the round of that state."""


def improves(value: float, best: float | None, *, mode: Mode, min_delta: float) -> bool:
    """Whether ``value`` beats ``best`` by more than ``min_delta`` (``None``: nothing seen yet).

    NaN never improves.

    >>> improves(0.91, 0.90, mode="max", min_delta=0.0), improves(0.905, 0.90, mode="max", min_delta=0.01)
    (True, False)
    >>> improves(0.4, 0.5, mode="min", min_delta=0.0), improves(float("nan"), None, mode="max", min_delta=0.0)
    (True, False)
    """
    if math.isnan(value):
        return False
    if best is None:
        return True
    return value > best + min_delta if mode == "max" else value < best - min_delta


def state_round(module: L.LightningModule) -> int:
    """The round whose state ``module`` holds: the restored best round while it is tested, else the global step."""
    restored = getattr(module, SCORED_ROUND_ATTRIBUTE, None)
    return int(restored) if restored is not None else int(module.global_step)


class RoundEarlyStopping(L.Callback):
    """Stops after ``patience`` evaluations without improvement of ``monitor``; tests the best round.

    Args:
        monitor: a validation metric (``val/...``) the run logs at every evaluation.
        patience: evaluations without improvement before the run stops (at least 1).
        mode: ``max`` (accuracy) or ``min`` (loss).
        min_delta: the least change that counts as an improvement (at least 0).
        restore_best: test the state of the best evaluated round (else the last round's).
    """

    def __init__(
        self,
        *,
        monitor: str,
        patience: int = 10,
        mode: Mode = "max",
        min_delta: float = 0.0,
        restore_best: bool = True,
    ) -> None:
        if not monitor.startswith("val/"):
            raise ConfigError(
                f"early_stopping.monitor={monitor!r} is not a validation metric; "
                "monitor one the run logs when it validates, e.g. early_stopping.monitor=val/acc."
            )
        if mode not in ("max", "min"):
            raise ConfigError(f"early_stopping.mode must be max or min (got {mode!r}).")
        if int(patience) < 1:
            raise ConfigError(f"early_stopping.patience must be at least 1 evaluation (got {patience}).")
        if not min_delta >= 0:
            raise ConfigError(f"early_stopping.min_delta must be at least 0 (got {min_delta}).")
        self.monitor = monitor
        self.patience = int(patience)
        self.mode: Mode = mode
        self.min_delta = float(min_delta)
        self.restore_best = bool(restore_best)
        self.best: float | None = None
        self.best_round: int | None = None
        self.wait = 0
        self.stopped_round: int | None = None
        self._best_state: dict[str, Tensor] | None = None

    # ------------------------------------------------------------------ Lightning hooks
    @override
    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.sanity_checking or trainer.state.fn != TrainerFn.FITTING:
            return
        metrics = trainer.callback_metrics
        if self.monitor not in metrics:
            logged = sorted(k for k in metrics if str(k).startswith("val/"))
            raise ConfigError(
                f"early_stopping.monitor={self.monitor} is not logged by this run's validation; "
                f"choose one of {', '.join(logged) or 'val/acc'}."
            )
        value = float(metrics[self.monitor])
        step = int(trainer.global_step)
        if improves(value, self.best, mode=self.mode, min_delta=self.min_delta):
            self.best, self.best_round, self.wait = value, step, 0
            if self.restore_best:
                self._best_state = {k: v.detach().clone() for k, v in pl_module.state_dict().items()}
            return
        self.wait += 1
        if self.wait >= self.patience and step < (trainer.max_steps or step + 1):
            self.stopped_round = step
            trainer.should_stop = True
            log.info(
                "Early stopping after round %d: %s has not improved on %.4f (round %s) for %d evaluations.",
                step,
                self.monitor,
                self.best if self.best is not None else float("nan"),
                self.best_round,
                self.wait,
            )

    @override
    def on_test_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        best_round, state = self.best_round, self._best_state
        if not self.restore_best or state is None or best_round is None or best_round == pl_module.global_step:
            setattr(pl_module, SCORED_ROUND_ATTRIBUTE, None)
            return
        pl_module.load_state_dict(state)
        setattr(pl_module, SCORED_ROUND_ATTRIBUTE, best_round)
        log.info("Testing the state of round %d, the best %s (%.4f).", best_round, self.monitor, self.best)

    @override
    def on_test_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        pl_module.log("test/scored_round", float(state_round(pl_module)))

    @override
    def on_test_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        setattr(pl_module, SCORED_ROUND_ATTRIBUTE, None)

    # ------------------------------------------------------------------ checkpoint state
    @override
    def state_dict(self) -> dict[str, Any]:
        return {
            "best": self.best,
            "best_round": self.best_round,
            "wait": self.wait,
            "stopped_round": self.stopped_round,
            "best_state": self._best_state,
        }

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.best = state_dict.get("best")
        self.best_round = state_dict.get("best_round")
        self.wait = int(state_dict.get("wait", 0))
        self.stopped_round = state_dict.get("stopped_round")
        saved = state_dict.get("best_state")
        self._best_state = {k: torch.as_tensor(v) for k, v in saved.items()} if saved else None


def early_stopping_callback(node: Mapping[str, Any] | None) -> RoundEarlyStopping | None:
    """The callback of the ``early_stopping`` config node, or ``None`` while its ``monitor`` is null.

    An unknown key stops with the closest valid one.

    >>> early_stopping_callback({"monitor": None, "patience": 10}) is None
    True
    >>> early_stopping_callback({"monitor": "val/acc", "patience": 3}).patience
    3
    """
    if not node:
        return None
    options = {str(k): v for k, v in node.items()}
    valid = [name for name in inspect.signature(RoundEarlyStopping).parameters]
    for key in options:
        if key not in valid:
            match = close_match(key, valid)
            hint = f" (did you mean {match}?)" if match else ""
            raise ConfigError(f"early_stopping.{key} is not an early-stopping setting{hint}; use {', '.join(valid)}.")
    if options.get("monitor") is None:
        return None
    return RoundEarlyStopping(**options)
