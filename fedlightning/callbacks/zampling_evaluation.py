"""Sampled-network evaluation of the Zampling family (arXiv 2503.14246), as a Lightning callback.

A Zampling-family module (:class:`fedlightning.methods.zampling.Zampling`, and FedPM and the
supermask built on it) evaluates its *expected network* w = Q·p as ``val/acc`` and
``test/acc``. :class:`ZamplingEvaluation` adds what the paper reports about the networks
that are actually sampled, on the same evaluation batches:

* ``<split>/acc_sampled_mean``, ``_std``, ``_max``: accuracy of ``val_samples`` (validation)
  or ``test_samples`` (test) networks w = Q·z, z ~ Bernoulli(p);
* ``<split>/acc_discretised``: the network of the rounded mask 1{p ≥ 0.5};
* ``<split>/integrality_gap``: expected network's accuracy − ``acc_sampled_mean``;
* ``val/acc_best_mask``: the best validation mask; ``test/acc_best_mask``: that same mask
  (same round, same index: both draws come from the server stream of the round) scored on
  test, as the paper picks a mask on held-out data; a test of a round that was not
  validated (a test-only run from a checkpoint) has no chosen mask and logs none;
* with ``sensitivity_taus``, at test time, the parameter-sensitivity study of the paper
  (§"Generalisation Properties via Parameter Sensitivity") as ``test/sensitivity/...``, see
  :meth:`ZamplingEvaluation.sensitivity_metrics`.

With several processes each one evaluates its own shard of the split; every accuracy here is
pooled from the correct counts of all of them (one all-reduce), so it is the whole split's.
p is the module's :meth:`~fedlightning.methods.zampling.Zampling.effective_p` of its state.
Sampled networks are scored ``networks_per_forward`` at a time: their masks are multiplied by Q
in one pass (:meth:`~fedlightning.models.zampling.SparseQ.matmat`) and run through one batched
forward (:meth:`~fedlightning.models.zampling.ZampledNetwork.forward_many`); with 1 they are
scored one by one. The masks and their order are the same either way.
Masks come from the streams (seed, round, server, ``"zampling_eval_masks"`` /
``"zampling_sensitivity"``), so a run's metrics do not depend on when or how often it is
evaluated. The round is that of the state being scored
(:func:`~fedlightning.callbacks.early_stopping.state_round`): after early stopping the test
scores the best round's p with that round's masks, as a run that ended there would. Only
classification tasks are scored.

The module names it in ``needed_callbacks``; the runner attaches one instance to the trainer that
fits and tests it (:mod:`fedlightning.callbacks.declared`), so the mask chosen on validation is
the one scored on test. Its settings are the keyword arguments of :class:`ZamplingEvaluation`, the
config node ``reports.zampling_evaluation`` (``configs/reports/default.yaml``); the method reads none of them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Literal

import lightning as L
import torch
from torch import Tensor
from typing_extensions import override

from fedlightning.callbacks.early_stopping import state_round
from fedlightning.callbacks.zampling_sensitivity import (
    Region,
    accuracy_deviation,
    perturbation_draw,
    perturbation_support,
    relative_sensitivity,
)
from fedlightning.errors import ConfigError
from fedlightning.federated.rng import SERVER
from fedlightning.models.zampling import ZampledNetwork, bernoulli_draw

if TYPE_CHECKING:
    from fedlightning.methods.zampling import Zampling

__all__ = ["SETTINGS", "ZamplingEvaluation"]

SETTINGS = "reports.zampling_evaluation"
"""The config node that holds the keyword arguments of :class:`ZamplingEvaluation`."""


class ZamplingEvaluation(L.Callback):
    """Scores sampled networks after each validation and test pass (see the module docstring).

    Each argument is a key of the config node ``reports.zampling_evaluation``.

    Args:
        val_samples: sampled networks per validation.
        test_samples: sampled networks per test (the paper: 100).
        networks_per_forward: sampled networks scored per batched forward (one pass of Q over
            all their masks, one ``vmap``-ed forward); 1 scores them one by one.
        sensitivity_taus: τ values of the test-time parameter-sensitivity study of the paper
            (§"Generalisation Properties via Parameter Sensitivity"), logged as
            ``test/sensitivity/<τ>/...`` (:meth:`sensitivity_metrics`); empty: off.
        sensitivity_perturbations: perturbations of p inside C_τ per τ (the paper: 10).
        sensitivity_samples: sampled networks per perturbed p (the paper: 10).
        sensitivity_region: the perturbed coordinates
            (:func:`~fedlightning.callbacks.zampling_sensitivity.perturbation_support`).
    """

    def __init__(
        self,
        *,
        val_samples: int = 20,
        test_samples: int = 100,
        networks_per_forward: int = 10,
        sensitivity_taus: Sequence[float] = (),
        sensitivity_perturbations: int = 10,
        sensitivity_samples: int = 10,
        sensitivity_region: Region = "hypercube",
    ) -> None:
        for key, value in (
            ("val_samples", val_samples),
            ("test_samples", test_samples),
            ("networks_per_forward", networks_per_forward),
            ("sensitivity_perturbations", sensitivity_perturbations),
            ("sensitivity_samples", sensitivity_samples),
        ):
            if value < 1:
                one_by_one = "; 1 scores the sampled networks one by one" if key == "networks_per_forward" else ""
                raise ConfigError(f"{SETTINGS}.{key} must be at least 1 (got {value}){one_by_one}.")
        perturbation_support(torch.zeros(1), 0.0, sensitivity_region)  # validates the region
        for tau in sensitivity_taus:
            perturbation_support(torch.zeros(1), float(tau), sensitivity_region)  # validates τ
        self.networks_per_forward = int(networks_per_forward)
        self.val_samples = int(val_samples)
        self.test_samples = int(test_samples)
        self.sensitivity_taus = tuple(float(t) for t in sensitivity_taus)
        self.sensitivity_perturbations = int(sensitivity_perturbations)
        self.sensitivity_samples = int(sensitivity_samples)
        self.sensitivity_region: Region = sensitivity_region
        self._batches: list[tuple[Tensor, Tensor]] = []
        self._network: ZampledNetwork | None = None
        self._val_best_index: dict[int, int] = {}  # round → index of its best validation mask

    # ------------------------------------------------------------------ Lightning hooks
    @override
    def on_validation_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._batches = []

    @override
    def on_test_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._batches = []

    @override
    def on_validation_batch_end(
        self,
        trainer: L.Trainer,
        pl_module: L.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        self._stash(batch)

    on_test_batch_end = on_validation_batch_end  # the same stash of the split's batches

    @override
    def on_validation_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not trainer.sanity_checking:
            self._log(pl_module, self.sampled_metrics(pl_module, "val"))  # type: ignore[arg-type]
        self._batches = []

    @override
    def on_test_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        module: Zampling = pl_module  # type: ignore[assignment]
        if self.sensitivity_taus and self._scored(module):
            self._log(module, self.sensitivity_metrics(module))
        self._log(module, self.sampled_metrics(module, "test"))
        self._batches = []

    # ------------------------------------------------------------------ metrics
    @torch.no_grad()
    def accuracy(self, module: Zampling, w: Tensor) -> float:
        """Accuracy of the network with weights ``w`` on the batches of the current pass (all processes')."""
        network = self._zampled(module)
        correct, total = 0, 0
        for x, y in self._batches:
            out = network.forward(x, w)
            correct += int((out.argmax(dim=1) == y).sum())
            total += len(y)
        return float(self._pooled(module, torch.tensor([correct]), total)[0])

    @staticmethod
    def _pooled(module: Zampling, correct: Tensor, total: int) -> Tensor:
        """Accuracies (float64) from the correct counts summed over the processes, each of which
        evaluated its own shard of the split; one all-reduce carries the counts and the sample total."""
        packed = torch.cat([correct.to(torch.float64), torch.tensor([float(total)], dtype=torch.float64)])
        packed = module.reduce_sum(packed).cpu()
        return packed[:-1] / max(float(packed[-1]), 1.0)

    def _zampled(self, module: Zampling) -> ZampledNetwork:
        network = self._network
        if network is None or network.model is not module.model:
            network = self._network = ZampledNetwork(module.model)
        return network

    @torch.no_grad()
    def accuracies(self, module: Zampling, w: Tensor) -> Tensor:
        """Accuracy of each of the B networks with weights ``w`` (B, m) on the current pass (float64, all processes)."""
        network = self._zampled(module)
        correct = torch.zeros(w.shape[0], dtype=torch.int64)
        total = 0
        for x, y in self._batches:
            out = network.forward_many(x, w)
            correct += (out.argmax(dim=-1) == y).sum(dim=-1).cpu()
            total += len(y)
        return self._pooled(module, correct, total)

    def sampled_accuracies(self, module: Zampling, p: Tensor, num_samples: int, gen: torch.Generator) -> Tensor:
        """Accuracy of ``num_samples`` networks w = Q·z, z ~ Bernoulli(p) drawn from ``gen`` (float64).

        The masks are drawn in order from ``gen`` and scored ``networks_per_forward`` at a time.
        """
        if self.networks_per_forward == 1:
            accs = [self.accuracy(module, module.weights_of(bernoulli_draw(p, gen))) for _ in range(num_samples)]
            return torch.tensor(accs, dtype=torch.float64)
        chunks = []
        for start in range(0, num_samples, self.networks_per_forward):
            size = min(self.networks_per_forward, num_samples - start)
            masks = torch.stack([bernoulli_draw(p, gen) for _ in range(size)])
            chunks.append(self.accuracies(module, module.weights_of_many(masks)))
        return torch.cat(chunks)

    @torch.no_grad()
    def sampled_metrics(self, module: Zampling, split: Literal["val", "test"]) -> dict[str, float]:
        """The ``<split>/acc_sampled_*``, ``acc_discretised``, ``integrality_gap`` and ``acc_best_mask`` values."""
        if not self._scored(module):
            return {}
        num_samples = self.val_samples if split == "val" else self.test_samples
        p = module.effective_p(module.p.detach())
        expected = self.accuracy(module, module.weights_of(p))
        round_idx = state_round(module)
        gen = module.generator(round_idx, SERVER, "zampling_eval_masks")
        accs = self.sampled_accuracies(module, p.cpu(), num_samples, gen)
        discretised = self.accuracy(module, module.weights_of((p >= 0.5).float()))
        metrics = {
            f"{split}/acc_sampled_mean": float(accs.mean()),
            f"{split}/acc_sampled_std": float(accs.std()) if len(accs) > 1 else 0.0,
            f"{split}/acc_sampled_max": float(accs.max()),
            f"{split}/acc_discretised": discretised,
            f"{split}/integrality_gap": expected - float(accs.mean()),
        }
        if split == "val":
            best = int(accs.argmax())
            self._val_best_index[round_idx] = best
            metrics["val/acc_best_mask"] = float(accs[best])
        else:
            chosen = self._val_best_index.get(round_idx)
            if chosen is not None and chosen < len(accs):  # the same mask: same round's stream, same index
                metrics["test/acc_best_mask"] = float(accs[chosen])
        return metrics

    @torch.no_grad()
    def sensitivity_metrics(self, module: Zampling) -> dict[str, float]:
        """The paper's parameter-sensitivity table row for each τ, on the batches of the current pass.

        References are the unperturbed expected network Q·p and the mean of
        ``sensitivity_samples`` sampled networks; each of ``sensitivity_perturbations``
        perturbed vectors p̃ = clip(p + ε_τ, 0, 1) is scored the same way. Sensitivity is the
        relative accuracy drop, deviation the drop in percentage points per unit ‖ε_τ‖₂
        (``deviation_full_*``: per unit ‖ε‖₂ of the whole N(0, I_n) draw, the reading the
        paper's table is consistent with, see
        :func:`~fedlightning.callbacks.zampling_sensitivity.perturbation_draw`); all
        are averaged over the perturbations (``_std``: their standard deviation).
        """
        gen = module.generator(state_round(module), SERVER, "zampling_sensitivity")
        p = module.effective_p(module.p.detach()).cpu()

        def scores(vector: Tensor) -> tuple[float, float]:
            expected = self.accuracy(module, module.weights_of(vector))
            return expected, float(self.sampled_accuracies(module, vector, self.sensitivity_samples, gen).mean())

        reference = scores(p)
        out: dict[str, float] = {
            "test/sensitivity/reference_acc_expected": reference[0],
            "test/sensitivity/reference_acc_sampled": reference[1],
        }
        for tau in self.sensitivity_taus:
            rows: dict[str, list[float]] = {}
            for _ in range(self.sensitivity_perturbations):
                perturbed, eps, draw = perturbation_draw(p, tau, gen, self.sensitivity_region)
                norm, full_norm = float(eps.norm()), float(draw.norm())
                for kind, ref, acc in zip(("expected", "sampled"), reference, scores(perturbed), strict=True):
                    rows.setdefault(f"acc_{kind}", []).append(acc)
                    rows.setdefault(f"sensitivity_{kind}", []).append(relative_sensitivity(ref, acc))
                    rows.setdefault(f"deviation_{kind}", []).append(accuracy_deviation(ref, acc, norm))
                    rows.setdefault(f"deviation_full_{kind}", []).append(accuracy_deviation(ref, acc, full_norm))
                rows.setdefault("eps_norm", []).append(norm)
                rows.setdefault("eps_full_norm", []).append(full_norm)
            support = perturbation_support(p, tau, self.sensitivity_region)
            out[f"test/sensitivity/{tau:g}/perturbed_fraction"] = float(support.float().mean())
            for key, values in rows.items():
                t = torch.tensor(values, dtype=torch.float64)
                out[f"test/sensitivity/{tau:g}/{key}"] = float(t.mean())
                out[f"test/sensitivity/{tau:g}/{key}_std"] = float(t.std()) if len(values) > 1 else 0.0
        return out

    # ------------------------------------------------------------------ helpers
    def _stash(self, batch: Any) -> None:
        x, y = batch[0], batch[1]
        self._batches.append((x.detach(), y.detach()))

    def _scored(self, module: Zampling) -> bool:
        # With several processes every one takes part in the collectives, even one whose shard is empty.
        return module.task == "classification" and (bool(self._batches) or module.world_size > 1)

    @staticmethod
    def _log(module: L.LightningModule, metrics: dict[str, float]) -> None:
        for name, value in metrics.items():
            module.log(name, value)
