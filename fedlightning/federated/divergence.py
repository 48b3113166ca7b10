"""The divergence guard: a diverged run stops with one sentence instead of reporting numbers.

The round engine (:class:`~fedlightning.federated.module.FederatedModule`) checks, cheaply
(one reduction per upload, one per aggregate and one per server state):

* each client's upload and loss: a non-finite one is **quarantined** (not aggregated,
  counted under ``failures/quarantined``, logged with a warning naming the client and round)
  or, with ``on_nonfinite_client="stop"``, stops the run; a round whose every client is
  quarantined stops the run;
* the reduced aggregate, and the server state after the server step: non-finite stops;
* the round's training loss and every validation/test loss: non-finite, or more than
  ``max_loss_ratio`` times the loss at the start (the mean loss of the initial global model on
  each first-round client's first mini-batch, or the first round's mean loss for methods that
  train without the engine's ``local_train``; saved in checkpoints; a run resumed from a
  checkpoint without it checks for non-finite values only), stops.

Stopping raises :class:`DivergenceError`, whose message names the likely key: the client
learning rate (or ``method.max_grad_norm``) when clients diverged, the server learning rate
when the global model diverged after a server-optimiser step.

A quarantined client is treated as a dropped upload: it received the broadcast (counted) and
trained, but contributes neither to the sums nor to the total weight, so the normalised
estimator renormalises over the remaining uploads and the unbiased estimator
Σ (w_i/p_i) Δ_i loses its term (as for any lost upload). Under a sampler that chooses the
uploaders after local work, a quarantined member reports a zero update norm (it is not chosen)
and is left out of the cohort's total weight. What the method's ``client_update`` stored in the
client's own state during that round (e.g. a saved local optimiser state) is kept; the
channel's error-feedback memory is untouched, since nothing was encoded.

>>> exploded(loss=2.5e3, start=2.3, max_ratio=1e3)
True
>>> exploded(loss=float("nan"), start=2.3, max_ratio=None)
True
>>> exploded(loss=40.0, start=2.3, max_ratio=1e3)
False
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import lightning as L
from typing_extensions import override

from fedlightning.errors import ConfigError, NonFiniteLossError
from fedlightning.federated.hooks import FederatedCallback

if TYPE_CHECKING:
    from fedlightning.federated.module import FederatedModule

OnNonFinite = Literal["quarantine", "stop"]


class DivergenceError(NonFiniteLossError):
    """The run diverged (a non-finite or exploding loss, aggregate or server state)."""


def exploded(*, loss: float, start: float | None, max_ratio: float | None) -> bool:
    """Whether ``loss`` is non-finite, or above ``max_ratio`` × ``start`` (when both are known and positive)."""
    if not math.isfinite(loss):
        return True
    if max_ratio is None or start is None or not math.isfinite(start) or start <= 0:
        return False
    return loss > max_ratio * start


@dataclass(frozen=True)
class DivergencePolicy:
    """What the engine does when training diverges (see the module docstring).

    Attributes:
        max_loss_ratio: stop when a training or validation loss exceeds this multiple of the
            loss at the start (``None``: only non-finite losses stop).
        on_nonfinite_client: ``"quarantine"`` a non-finite client update, or ``"stop"`` the run.
    """

    max_loss_ratio: float | None = 1e3
    on_nonfinite_client: OnNonFinite = "quarantine"

    def __post_init__(self) -> None:
        if self.max_loss_ratio is not None and not (self.max_loss_ratio > 1):
            raise ConfigError(
                f"divergence.max_loss_ratio must be above 1 or null (got {self.max_loss_ratio}); e.g. 1e3."
            )
        if self.on_nonfinite_client not in ("quarantine", "stop"):
            raise ConfigError(
                f"divergence.on_nonfinite_client is quarantine or stop (got {self.on_nonfinite_client!r})."
            )


class DivergenceGuard(FederatedCallback):
    """Sets the engine's :class:`DivergencePolicy` from the ``divergence:`` config.

    Args:
        max_loss_ratio: see :class:`DivergencePolicy`.
        on_nonfinite_client: see :class:`DivergencePolicy`.
    """

    def __init__(self, *, max_loss_ratio: float | None = 1e3, on_nonfinite_client: OnNonFinite = "quarantine") -> None:
        ratio = None if max_loss_ratio is None else float(max_loss_ratio)
        self.policy = DivergencePolicy(max_loss_ratio=ratio, on_nonfinite_client=on_nonfinite_client)

    @override
    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        module: FederatedModule = pl_module  # type: ignore[assignment]
        module.divergence = self.policy
