"""The Zampling family's local work for a whole share of clients at once (the ``vectorised`` backend).

Paper: Villani, Natale, Mallmann-Trenn, "Sampling networks by sampling: Zampling",
arXiv 2503.14246; FedPM (Isik et al., arXiv 2209.15328) and Zhou et al.'s supermask
(arXiv 1905.01067) share the client update. Each client k of a round trains its score
s_k ∈ R^n from the broadcast p; here the K clients of a process's share are stacked:

* the scores are one (K, n) tensor S, and every step computes P = p(S) for all clients;
* each client draws its mask z_k ~ Bernoulli(p_k) on the CPU from its own ``zampling_mask``
  stream, exactly as :meth:`~fedlightning.models.sampled_network.SampledNetwork.resample` draws it
  (:func:`~fedlightning.models.zampling.bernoulli_draw`, one draw per step it takes, none on a
  padded step); the K masks are stacked and moved to the device once per step;
* W = Q·Z for the K masks in one product (:meth:`SparseQ.matmat`), the K networks' forward and
  backward in one ``torch.func.vmap`` of the functional model, ∂L/∂P = Qᵀ·∂L/∂W in one product
  (:meth:`SparseQ.rmatmat`), zero where p ∈ {0, 1} under Zampling's gradient mask and times p
  under FedPM's estimator (:meth:`ZampledWeights.straight_through`), then through p(s)
  (:meth:`ScoreEstimator.score_gradient`);
* ``max_grad_norm`` clips each client's gradient as ``clip_grad_norm_`` would, and the client
  optimiser steps all K through :mod:`fedlightning.federated.local.stacked_optim`.

Batches are each client's own ``batches`` stream (:meth:`FederatedModule.client_batches`,
cut to a straggler's budget), padded to a common plan (:func:`plan_steps`): a short batch counts
only its samples, a client with fewer steps takes inactive ones that draw no mask and leave its
score and optimiser state as they were. The uploads (a mask from the ``zampling_upload``
stream, or p_new) and the per-client metrics are built as :meth:`Zampling.client_update` builds
them. The scores equal the loop's within float rounding (w = Q·z is a full product here where
the loop updates it incrementally, and the K networks run batched), so each mask is the loop's
unless a uniform falls within that rounding of its p.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fedlightning.federated.local.base import ClientResult
from fedlightning.federated.local.stacked_optim import StackedOptimizer, refusal, stacked_optimizer
from fedlightning.federated.local.vectorised import StepPlan, randomness_refusal, share_data
from fedlightning.models.zampling import SparseQ, ZampledNetwork, bernoulli_draw

if TYPE_CHECKING:
    from fedlightning.methods.zampling import Zampling
    from fedlightning.models.zampling_estimators import ScoreEstimator

__all__ = ["StackedScores", "stacked_client_updates", "stacked_refusal", "train_scores_stacked"]


def stacked_refusal(method: Zampling) -> str | None:
    """Why :func:`stacked_client_updates` cannot train ``method``'s clients as its loop does (``None``: it can).

    One clause naming the config key, for the backend's sentence.
    """
    if method.local_patience is not None:
        return "method.local_patience stops each client at its own epoch (client-side early stopping)"
    if not method.reset_optimizer:
        return "method.reset_optimizer=false carries each client's optimiser state from round to round"
    why = refusal(method.round_client_optimizer)
    if why:
        return why.rstrip(".")
    loss = method.loss_fn
    if type(loss) is not nn.CrossEntropyLoss or loss.weight is not None or loss.label_smoothing:
        return "its loss is not the plain cross-entropy of a classification task (data.task)"
    return randomness_refusal(method)


@dataclass(frozen=True)
class StackedScores:
    """What K clients' local training produced.

    Attributes:
        scores: (K, n) each client's final score.
        first_loss: (K,) each client's loss on its first batch (0 for a client without steps).
        mean_loss: (K,) each client's mean loss over its steps.
    """

    scores: Tensor
    first_loss: Tensor
    mean_loss: Tensor


def _draw_masks(p: Tensor, active: Sequence[bool], generators: Sequence[torch.Generator]) -> Tensor:
    """Each active client's mask z_k ~ Bernoulli(p_k) from its own stream (zeros where inactive), on p's device."""
    host = p.detach().cpu()  # one copy of the K rows
    z = torch.zeros_like(host)
    for c, (on, generator) in enumerate(zip(active, generators, strict=True)):
        if on:
            z[c] = bernoulli_draw(host[c], generator)  # the draw SampledNetwork.resample makes
    return z.to(p.device, non_blocking=True)


def train_scores_stacked(
    *,
    q: SparseQ,
    net: ZampledNetwork,
    estimator: ScoreEstimator,
    sampling: bool,
    start: Tensor,
    x: Tensor,
    y: Tensor,
    plan: StepPlan,
    optimizer: StackedOptimizer,
    generators: Sequence[torch.Generator],
    max_grad_norm: float | None,
) -> StackedScores:
    """Local training of K clients' scores at once from the same ``start`` score (arXiv 2503.14246).

    Args:
        q: the matrix (on the data's device).
        net: the architecture, called functionally with each client's w = Q·z.
        estimator: p as a function of s, and the straight-through rule.
        sampling: draw masks (true) or train the continuous model w = Q·p (false).
        start: (n,) the score every client starts from.
        x, y: the concatenated data of the K clients (``plan.index`` points into them).
        plan: the padded schedule.
        optimizer: the client optimiser, stacked (fresh).
        generators: each client's ``zampling_mask`` stream, in client order.
        max_grad_norm: per-client clipping of each step's score gradient (as ``clip_grad_norm_``).
    """
    k, steps, _ = plan.index.shape
    device = x.device
    scores = start.detach().to(device, torch.float32).unsqueeze(0).expand(k, -1).clone()
    index, mask = plan.index.to(device), plan.mask.to(device)
    counts = mask.sum(dim=2).clamp(min=1).to(torch.float32)
    active = plan.active.to(device)

    def client_loss(w: Tensor, xb: Tensor, yb: Tensor, mb: Tensor, count: Tensor) -> Tensor:
        per = F.cross_entropy(net.forward(xb, w), yb, reduction="none")
        return (per * mb).sum() / count

    batched = torch.func.vmap(client_loss)
    loss_sum = torch.zeros(k, device=device)
    first_loss = torch.zeros(k, device=device)
    for s in range(steps):
        on_host = plan.active[:, s]
        with torch.no_grad():
            p = estimator.probability(scores)
            z = _draw_masks(p, on_host.tolist(), generators) if sampling else p
            w = q.matmat(z).to(device)
        w.requires_grad_(True)
        idx = index[:, s]
        losses = batched(w, x[idx], y[idx], mask[:, s].to(torch.float32), counts[:, s])
        (grad_w,) = torch.autograd.grad(losses.sum(), [w])
        with torch.no_grad():
            grad_p = q.rmatmat(grad_w).to(device)  # straight through: ∂L/∂p := ∂L/∂z = Qᵀ·∂L/∂w
            if estimator.mask_frozen:  # Zampling's gradient mask: none where p is 0 or 1
                grad_p = torch.where((p > 0.0) & (p < 1.0), grad_p, 0.0)
            if estimator.scale_by_p:  # FedPM's estimator
                grad_p = grad_p * p
            grad = estimator.score_gradient(scores, p, grad_p, zero_where_frozen=estimator.mask_frozen)
            if max_grad_norm is not None:  # clip_grad_norm_ on each client's one parameter
                norm = torch.linalg.vector_norm(grad, dim=1)
                coef = (max_grad_norm / (norm + 1e-6)).clamp(max=1.0)
                grad = grad * coef.unsqueeze(1)
            optimizer.step_({"score": scores}, {"score": grad}, on_host)
            step_loss = torch.where(active[:, s], losses.detach(), torch.zeros_like(losses))
            loss_sum += step_loss
            if s == 0:
                first_loss = step_loss.clone()
    mean_loss = loss_sum / plan.steps.to(device).clamp(min=1).to(loss_sum.dtype)
    return StackedScores(scores=scores, first_loss=first_loss, mean_loss=mean_loss)


def stacked_client_updates(
    method: Zampling, *, round_idx: int, share: list[int], received: Tensor
) -> list[ClientResult]:
    """Each client of ``share``'s :meth:`Zampling.client_update` result, the K clients trained at once.

    ``received`` is the decoded broadcast p. The clients' batches, masks and uploads come from
    their own streams, as on the loop; see the module docstring.
    """
    p_start = method.effective_p(received)
    estimator = method.score_estimator
    method.client_model.train()
    data = share_data(method, share=share, round_idx=round_idx)
    xs, ys, schedules = data.x, data.y, data.schedules
    x_all = method.datamodule.transform(torch.cat(xs))  # each batch's augment: the base's, transform alone
    optimizer = stacked_optimizer(method.round_client_optimizer)
    assert optimizer is not None, "stacked_refusal() was not asked"
    trained = train_scores_stacked(
        q=method.q,
        net=method.net,
        estimator=estimator,
        sampling=method.sampling,
        start=estimator.score(p_start),
        x=x_all,
        y=torch.cat(ys),
        plan=data.plan(method.batch_size),
        optimizer=optimizer,
        generators=[method.generator(round_idx, client_id, "zampling_mask") for client_id in share],
        max_grad_norm=method.max_grad_norm,
    )
    took = torch.tensor([len(b) > 0 for b in schedules], device=trained.first_loss.device)
    method.record_start_losses(trained.first_loss[took])  # the received p's loss on each client's first batch
    results = []
    for c, client_id in enumerate(share):
        p_new = estimator.probability(trained.scores[c]).detach()
        upload, metrics = method.client_upload(client_id=client_id, round_idx=round_idx, p_new=p_new, p_start=p_start)
        results.append(ClientResult(upload=upload, num_samples=len(ys[c]), loss=trained.mean_loss[c], metrics=metrics))
    return results
