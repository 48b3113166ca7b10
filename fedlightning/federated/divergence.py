"""The divergence guard: a diverged run stops with one sentence instead of reporting numbers.

The round engine (:class:`~fedlightning.federated.module.FederatedModule`) checks, cheaply
(one reduction per upload, one per aggregate and one per server state), through
:func:`upload_check`, :class:`DivergenceWatch` (which also keeps the run's record) and
:func:`check_server_state`:

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
when the global model diverged after a server-optimiser step, and the data when the received
model's loss is non-finite before any step (no learning rate has acted yet; see
:func:`data_fix`).

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

import logging
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import lightning as L
import torch
from torch import Tensor, nn
from typing_extensions import override

from fedlightning.errors import ConfigError, NonFiniteLossError
from fedlightning.federated.hooks import FederatedCallback
from fedlightning.federated.rounds import LOSS, QUARANTINED, START_COUNT, START_SUM, TRAINED

if TYPE_CHECKING:
    from fedlightning.federated.module import FederatedModule
    from fedlightning.federated.rounds import RoundState

log = logging.getLogger(__name__)

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


def upload_check(loss: Tensor, upload: Tensor) -> tuple[float, float]:
    """A client's mean loss and the sum of its upload, read in one transfer (one device sync).

    The sum is non-finite whenever any entry is (an ``inf`` or ``nan`` propagates; opposite
    infinities give ``nan``), so one reduction decides the quarantine.

    >>> upload_check(torch.tensor(0.5), torch.tensor([1.0, 2.0]))
    (0.5, 3.0)
    >>> math.isfinite(upload_check(torch.tensor(0.5), torch.tensor([1.0, float("inf"), -float("inf")]))[1])
    False
    """
    pair = torch.stack([loss.detach().reshape(()).float(), upload.detach().sum().float()])
    first, second = pair.tolist()
    return float(first), float(second)


def divergence_fix(module: FederatedModule, side: Literal["clients", "server"]) -> str:
    """The likely key to change, as the end of a sentence."""
    if side == "server" and not module.sets_server_state:
        inner = module.server_optimizer(module.server_parameters())  # a probe: its settings, not its state
        group = inner.param_groups[0]
        plain = type(inner) is torch.optim.SGD and group.get("lr") == 1.0 and not group.get("momentum")
        if not plain:  # FedAvg's plain averaging step cannot explode by itself
            return f"lower the server learning rate (method.server_optimizer.lr) from {group.get('lr'):g}"
    try:
        client_lr = f" from {module.client_optimizer([nn.Parameter(torch.zeros(1))]).param_groups[0]['lr']:g}"
    except Exception:  # a factory that needs more than plain parameters
        client_lr = ""
    clip = "set method.max_grad_norm" if module.max_grad_norm is None else "lower method.max_grad_norm"
    return f"lower the client learning rate (method.client_optimizer.lr){client_lr} or {clip}"


def data_fix(module: FederatedModule) -> str:
    """The end of a sentence blaming the data: a loss non-finite before any step is not the learning rate's doing."""
    name = getattr(getattr(module, "datamodule", None), "name", None) or "the data set"
    return (
        "the model's loss was non-finite before any step, so the learning rate is not the cause: "
        f"{name}'s features or targets are not finite or too large for float32; check its data.* settings or files"
    )


def check_server_state(module: FederatedModule, round_idx: int) -> None:
    """Stop when the server state is non-finite after the server step (one reduction)."""
    total = torch.stack([p.detach().sum() for p in module.server_parameters()]).sum()
    if not bool(torch.isfinite(total)):
        raise DivergenceError(
            f"The server state became non-finite in round {round_idx + 1}; {divergence_fix(module, 'server')}."
        )


class DivergenceWatch:
    """The engine's divergence record (checkpointed) and the checks that read it.

    It holds the loss at the start (the reference of ``max_loss_ratio``, measured in round 0)
    and the run's count of quarantined clients; the policy is ``module.divergence``.
    """

    def __init__(self, module: FederatedModule) -> None:
        self.module = module
        self.start_loss: float | None = None
        self.quarantined_total = 0
        self._start_acc: Tensor | None = None  # first-step losses of the attempt that measures them

    def begin_attempt(self, round_idx: int, device: torch.device) -> None:
        """Measure the start's first-step losses in this attempt when the start is still unknown (round 0)."""
        measure = self.start_loss is None and round_idx == 0
        self._start_acc = torch.zeros(2, dtype=torch.float64, device=device) if measure else None

    def record_start_losses(self, losses: Tensor) -> None:
        """Add clients' first-step losses while the attempt measures the start."""
        if self._start_acc is not None:
            self._start_acc[0] += losses.sum().to(self._start_acc)
            self._start_acc[1] += losses.numel()

    def end_attempt(self, rnd: RoundState) -> None:
        """Write the attempt's (sum, count) of first-step losses into its statistics, if it measured them."""
        if self._start_acc is not None:
            rnd.stats[START_SUM : START_COUNT + 1] = self._start_acc.cpu()
            self._start_acc = None

    def quarantine(self, rnd: RoundState, client_id: int, loss: float) -> None:
        """Count a client's non-finite update in the round (it is not aggregated) and log it."""
        rnd.stats[QUARANTINED] += 1
        rnd.quarantined.append(client_id)
        policy = self.module.divergence
        stop = policy.on_nonfinite_client == "stop"
        log.warning(
            "Round %d: client %d produced a non-finite update (loss %.4g); %s (divergence.on_nonfinite_client=%s).",
            rnd.round_idx + 1,
            client_id,
            loss,
            "the run stops" if stop else "it is quarantined, not aggregated",
            policy.on_nonfinite_client,
        )

    def check_attempt(self, rnd: RoundState) -> None:
        """Stop a diverged attempt on every process (its reduced statistics are the same on each)."""
        quarantined, trained = int(rnd.stats[QUARANTINED]), int(rnd.stats[TRAINED])
        round_idx, loss_sum = rnd.round_idx, float(rnd.stats[LOSS])
        module, policy = self.module, self.module.divergence
        self.quarantined_total += quarantined
        # A first-step loss (round 0, before any step) that is already non-finite is the data's fault.
        start_sum, start_count = float(rnd.stats[START_SUM]), float(rnd.stats[START_COUNT])
        data_at_fault = bool(start_count) and not math.isfinite(start_sum)

        def fix() -> str:  # built only when the run stops (divergence_fix probes the optimiser factory)
            return data_fix(module) if data_at_fault else divergence_fix(module, "clients")

        if quarantined and (policy.on_nonfinite_client == "stop" or trained == 0):
            first = min(module._gather_ids(rnd.quarantined))
            if trained == 0 and quarantined > 1:
                who = f"Client {first} and all other clients produced non-finite updates"
            elif quarantined > 1:
                who = f"Client {first} and {quarantined - 1} other client(s) produced non-finite updates"
            else:
                who = f"Client {first} produced a non-finite update"
            raise DivergenceError(f"{who} in round {round_idx + 1}; {fix()}.")
        if self.start_loss is None and trained and round_idx == 0:
            count = float(rnd.stats[START_COUNT])
            start = float(rnd.stats[START_SUM]) / count if count else loss_sum / trained
            self.start_loss = start if math.isfinite(start) and start > 0 else None
        if trained:
            loss = loss_sum / trained
            if exploded(loss=loss, start=self.start_loss, max_ratio=policy.max_loss_ratio):
                raise DivergenceError(
                    f"Training diverged in round {round_idx + 1}: the clients' mean loss is {loss:.4g} "
                    f"against {self.start_loss or float('nan'):.4g} at the start (divergence.max_loss_ratio="
                    f"{policy.max_loss_ratio:g}); {fix()}."
                )
        if not bool(torch.isfinite(rnd.aggregator.sums.sum())):
            raise DivergenceError(f"The aggregate of round {round_idx + 1} is non-finite; {fix()}.")

    def check_global_loss(self, what: str, loss: float) -> None:
        """Stop when the global model's held-out loss is non-finite or exploded."""
        module = self.module
        if exploded(loss=loss, start=self.start_loss, max_ratio=module.divergence.max_loss_ratio):
            start = "" if self.start_loss is None else f" against {self.start_loss:.4g} at the start"
            if not module.global_step:  # the initial model: no step has been taken
                raise DivergenceError(
                    f"Training stopped before it began: the global model's {what} loss is "
                    f"{loss:.4g}; {data_fix(module)}."
                )
            raise DivergenceError(
                f"Training diverged after round {module.global_step}: the global model's {what} loss is "
                f"{loss:.4g}{start}; {divergence_fix(module, 'server')}."
            )

    def summary(self) -> dict[str, float | int]:
        """The engine's run totals for ``summary.json``."""
        totals: dict[str, float | int] = {"failures/quarantined_total": self.quarantined_total}
        if self.start_loss is not None:
            totals["divergence/start_loss"] = self.start_loss
        return totals

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint saves under ``"divergence"``."""
        return {"start_loss": self.start_loss, "quarantined_total": self.quarantined_total}

    def load_state_dict(self, saved: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` (a checkpoint without one checks for non-finite values only)."""
        self.start_loss = saved.get("start_loss")
        self.quarantined_total = int(saved.get("quarantined_total", 0))
