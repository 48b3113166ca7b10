"""Client failure injection: drop-outs before upload, stragglers, and a minimum quorum per round.

:class:`ClientFailures` is a :class:`~fedlightning.federated.hooks.FederatedCallback`; every
draw comes from the run's streams (seed, round, client, purpose) of
:mod:`fedlightning.federated.rng`, with the attempt of the round in the purpose, so a run is
reproducible, resumes exactly, and a repeated round draws fresh failures.

* **Drop-out**: each client that trained loses its upload with probability ``dropout``
  (Bernoulli per client and attempt, purpose ``failures/dropout/<attempt>``). The broadcast
  it received is counted, the upload is neither sent, counted nor aggregated.
* **Stragglers**: each client is a straggler with probability ``straggler_probability``
  (purpose ``failures/straggler/<attempt>``) and completes only ⌈f·K⌉ of its K planned local
  steps (``f = straggler_fraction``), through the engine's local-step budget. Its aggregation
  weight stays its share of the objective (n_i/n for FedAvg, McMahan et al., arXiv 1602.05629):
  the shorter update under-represents its objective, the objective inconsistency that FedNova
  (Wang et al., arXiv 2007.07481) removes by dividing each update by its actual number of
  steps τ_i. FedShuffle (arXiv 2204.13169, and its FedNova variant) plans step sizes and τ_i
  from the full local work before training; stragglers are refused there.
* **Quorum**: a round with fewer than ``min_uploads`` uploads at the server is repeated
  (``below_quorum="repeat"``: the same cohort receives the broadcast again, the client state
  rolled back, fresh failures, at most ``max_retries`` times, then skipped) or skipped
  (``"skip"``: the global model stays unchanged, the round counts).

Aggregation under drop-out at a known rate q (the thesis' estimators, arXiv 2207.00392, ch. 6):
the normalised estimator Σ_{arrived} w_i Δ_i / Σ_{arrived} w_i renormalises over the uploads
that arrived, unchanged by the drop-outs in expectation only when they are independent of
Δ_i; the unbiased estimator Σ_{arrived} (w_i/p_i) Δ_i has expectation (1−q) Σ_i w_i Δ_i, and
with ``reweight=True`` each arrived upload is divided by 1−q, restoring E = Σ_i w_i Δ_i.
Under a choosing sampler (optimal client sampling) the same 1/(1−q) applies to the chosen
uploads with either estimator.

>>> straggler_steps(planned=10, fraction=0.25)
3
>>> straggler_steps(planned=0, fraction=0.5)
0
"""

from __future__ import annotations

import logging
import math
from typing import TYPE_CHECKING, Any, Literal

import lightning as L
import torch
from typing_extensions import override

from fedlightning.errors import ConfigError
from fedlightning.federated.hooks import FederatedCallback, Verdict
from fedlightning.federated.rng import torch_generator

if TYPE_CHECKING:
    from fedlightning.federated.aggregators import Aggregator
    from fedlightning.federated.module import FederatedModule

log = logging.getLogger(__name__)

BelowQuorum = Literal["repeat", "skip"]
_DROPPED, _STRAGGLERS = 0, 1
_TOTALS = ("dropped", "stragglers", "rounds_skipped", "rounds_repeated")


def straggler_steps(*, planned: int, fraction: float) -> int:
    """⌈fraction · planned⌉: the local steps a straggler completes."""
    return min(planned, math.ceil(fraction * planned))


def bernoulli(*, seed: int, round_idx: int, client_id: int, purpose: str, probability: float) -> bool:
    """One Bernoulli(``probability``) draw from the stream (seed, round, client, purpose)."""
    if probability <= 0.0:
        return False
    gen = torch_generator(seed=seed, round_idx=round_idx, client_id=client_id, purpose=purpose)
    return bool(torch.rand((), generator=gen) < probability)


class ClientFailures(FederatedCallback):
    """Drop-outs, stragglers and a quorum (see the module docstring).

    Args:
        dropout: q, the probability that a client's upload is lost.
        straggler_probability: s, the probability that a client is a straggler.
        straggler_fraction: f in (0, 1], the fraction of its planned local steps a straggler completes.
        min_uploads: the quorum: fewer uploads at the server and the round is repeated or skipped.
        below_quorum: ``"repeat"`` or ``"skip"``.
        max_retries: repeats of one round before it is skipped.
        reweight: divide each arrived upload by 1−q (unbiased estimator, or a choosing sampler).
    """

    def __init__(
        self,
        *,
        dropout: float = 0.0,
        straggler_probability: float = 0.0,
        straggler_fraction: float = 0.5,
        min_uploads: int = 1,
        below_quorum: BelowQuorum = "skip",
        max_retries: int = 3,
        reweight: bool = False,
    ) -> None:
        if not 0.0 <= dropout < 1.0:
            raise ConfigError(f"failures.dropout is a probability below 1 (got {dropout}).")
        if not 0.0 <= straggler_probability <= 1.0:
            raise ConfigError(f"failures.straggler_probability is a probability (got {straggler_probability}).")
        if not 0.0 < straggler_fraction <= 1.0:
            raise ConfigError(f"failures.straggler_fraction must be in (0, 1] (got {straggler_fraction}).")
        if min_uploads < 0:
            raise ConfigError(f"failures.min_uploads must be at least 0 (got {min_uploads}).")
        if below_quorum not in ("repeat", "skip"):
            raise ConfigError(f"failures.below_quorum is repeat or skip (got {below_quorum!r}).")
        if max_retries < 0:
            raise ConfigError(f"failures.max_retries must be at least 0 (got {max_retries}).")
        if reweight and dropout == 0.0:
            raise ConfigError("failures.reweight divides by 1 - failures.dropout; set failures.dropout above 0.")
        self.dropout = float(dropout)
        self.straggler_probability = float(straggler_probability)
        self.straggler_fraction = float(straggler_fraction)
        self.min_uploads = int(min_uploads)
        self.below_quorum: BelowQuorum = below_quorum
        self.max_retries = int(max_retries)
        self.reweight = bool(reweight)
        self.repeats_rounds = below_quorum == "repeat" and self.max_retries > 0
        self.totals = dict.fromkeys(_TOTALS, 0)
        self._round = torch.zeros(2, dtype=torch.float64)  # this process's drop-outs and stragglers
        self._events = dict.fromkeys(("rounds_skipped", "rounds_repeated"), 0)
        self._attempt = 0
        self._budget_asked = False

    # ------------------------------------------------------------------ checks before compute
    @override
    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        module: FederatedModule = pl_module  # type: ignore[assignment]
        name = type(module).__name__
        if self.min_uploads > module.num_clients:
            raise ConfigError(
                f"failures.min_uploads={self.min_uploads} exceeds the {module.num_clients} clients; lower it."
            )
        sampler = module.client_sampler()
        choosing = sampler is not None and sampler.chooses_uploaders
        if self.reweight and module.aggregation == "normalised" and not choosing:
            raise ConfigError(
                "failures.reweight has no effect on the normalised estimator (it renormalises over the "
                "uploads that arrived); set method.aggregation=unbiased or failures.reweight=false."
            )
        from fedlightning.federated.module import FederatedModule

        if self.straggler_probability > 0 and type(module).client_batches is not FederatedModule.client_batches:
            raise ConfigError(
                f"{name} plans each client's local steps before training (step sizes, τ_i), which stragglers "
                "would cut short unseen; use failures.straggler_probability=0 with this method."
            )

    # ------------------------------------------------------------------ the round
    @override
    def on_round_start(self, trainer: L.Trainer, module: FederatedModule, round_idx: int) -> None:
        self._events = dict.fromkeys(self._events, 0)
        self._round.zero_()

    @override
    def on_attempt_start(self, trainer: L.Trainer, module: FederatedModule, round_idx: int, attempt: int) -> None:
        self._attempt = attempt
        self._budget_asked = False

    @property
    @override
    def cuts_local_steps(self) -> bool:
        return self.straggler_probability > 0

    @override
    def local_step_budget(
        self, trainer: L.Trainer, module: FederatedModule, round_idx: int, client_id: int, planned: int
    ) -> int | None:
        self._budget_asked = True
        purpose = f"failures/straggler/{self._attempt}"
        if not bernoulli(
            seed=module.seed,
            round_idx=round_idx,
            client_id=client_id,
            purpose=purpose,
            probability=self.straggler_probability,
        ):
            return None
        steps = straggler_steps(planned=planned, fraction=self.straggler_fraction)
        if steps < planned:
            self._round[_STRAGGLERS] += 1
        return steps

    @override
    def drops_upload(self, trainer: L.Trainer, module: FederatedModule, round_idx: int, client_id: int) -> bool:
        purpose = f"failures/dropout/{self._attempt}"
        lost = bernoulli(
            seed=module.seed, round_idx=round_idx, client_id=client_id, purpose=purpose, probability=self.dropout
        )
        if lost:
            self._round[_DROPPED] += 1
        return lost

    @override
    def arrival_probability(self, trainer: L.Trainer, module: FederatedModule, round_idx: int, client_id: int) -> float:
        return 1.0 - self.dropout if self.reweight else 1.0

    @override
    def round_verdict(
        self, trainer: L.Trainer, module: FederatedModule, round_idx: int, attempt: int, aggregator: Aggregator
    ) -> Verdict:
        if self.straggler_probability > 0 and not self._attempt_used_budget(module):
            raise ConfigError(
                f"{type(module).__name__} does not train through the engine's local_train, so stragglers cannot "
                "be simulated; use failures.straggler_probability=0 with this method."
            )
        if aggregator.count >= self.min_uploads:
            return "apply"
        if self.below_quorum == "repeat" and attempt < self.max_retries:
            self._events["rounds_repeated"] += 1
            log.warning(
                "Round %d, attempt %d: %d upload(s) reached the server, below failures.min_uploads=%d; repeating it.",
                round_idx + 1,
                attempt + 1,
                aggregator.count,
                self.min_uploads,
            )
            return "repeat"
        self._events["rounds_skipped"] += 1
        log.warning(
            "Round %d: %d upload(s) reached the server, below failures.min_uploads=%d%s; skipped, the global "
            "model is unchanged.",
            round_idx + 1,
            aggregator.count,
            self.min_uploads,
            f" after {attempt} repeat(s)" if attempt else "",
        )
        return "skip"

    def _attempt_used_budget(self, module: FederatedModule) -> bool:
        """Whether any process's local training asked for a step budget in this attempt."""
        asked = torch.tensor([float(self._budget_asked)], dtype=torch.float64)
        return bool(module.reduce_sum(asked) > 0)

    @override
    def on_round_end(
        self, trainer: L.Trainer, module: FederatedModule, round_idx: int, metrics: dict[str, Any]
    ) -> None:
        counts = module.reduce_sum(self._round.clone())
        events = {
            "dropped": int(counts[_DROPPED]),
            "stragglers": int(counts[_STRAGGLERS]),
            **self._events,
        }
        for name, value in events.items():
            self.totals[name] += value
            metrics[f"failures/{name}"] = float(value)

    # ------------------------------------------------------------------ results and checkpoints
    @override
    def summary_metrics(self) -> dict[str, float | int]:
        return {f"failures/{name}_total": value for name, value in self.totals.items()}

    @override
    def state_dict(self) -> dict[str, Any]:
        return {"totals": dict(self.totals)}

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.totals = {name: int(state_dict.get("totals", {}).get(name, 0)) for name in _TOTALS}
