"""E-FLoPS clients trained at once on stacked parameters, for the ``vectorised`` backend.

E-FLoPS (arXiv 2607.00275; :mod:`fedlightning.methods.eflops`) trains, on every client, the
weights θ̃ and the hard-concrete gate parameters log α (Louizos et al., arXiv 1712.01312) for

    L = ℓ(h(x; θ̃ ⊙ z)) + λ c(φ) + (μ/2) c² + T_t KL,

one gate sample z per mini-batch, and after every step clamps log α and takes a dual-ascent step
on λ. :func:`stacked_client_updates` runs the K clients of a share at once: θ̃ (K, ...), log α
(K, |θ|) and λ (K,) stacked along a leading client axis, one ``torch.func.vmap`` of the loss
(``torch.func.functional_call`` on the gated weights) per step, one backward pass, and two
stacked optimisers (:mod:`fedlightning.federated.local.stacked_optim`): θ̃ with the client
optimiser, log α with the same optimiser at ``method.log_alpha_lr`` (the two parameter groups of
:meth:`EFLoPS.client_update`). It reproduces :meth:`EFLoPS.client_update` client by client:

* the batches are each client's own ``client_batches`` on its own ``client_data`` (padded to
  one :class:`~fedlightning.federated.local.vectorised.StepPlan`; a padded step leaves a client
  exactly as it was);
* the gate noise of each step is each active client's next draw from its own ``"gates"`` stream,
  drawn on the host as the loop draws it, then moved to the device once per step;
* λ is kept per client in float64, as the loop's Python float, and enters the loss as float32;
* the upload is the method's own :meth:`~EFLoPS.upload_message` of each client's final (θ̃, log α, λ).

:func:`stacked_refusal` names every setting this does not reproduce (``off_support_gates=regrow``,
client optimisers other than SGD/Adam/AdamW, augmenting data, dropout layers).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor
from torch.func import functional_call

from fedlightning.federated.local.base import ClientResult
from fedlightning.federated.local.stacked_optim import StackedOptimizer, stacked_optimizer
from fedlightning.federated.local.stacked_optim import refusal as optimiser_refusal
from fedlightning.federated.local.vectorised import per_sample_loss, randomness_refusal, share_data
from fedlightning.models.hard_concrete import uniform_noise

if TYPE_CHECKING:
    from fedlightning.methods.eflops import EFLoPS

__all__ = ["gate_optimizer_factory", "stacked_client_updates", "stacked_refusal"]

OptimizerFactory = Callable[..., torch.optim.Optimizer]


def gate_optimizer_factory(factory: OptimizerFactory, lr: float) -> OptimizerFactory:
    """The client optimiser of the log α group: ``factory``'s settings with the learning rate ``lr``.

    :meth:`EFLoPS.client_update` passes ``{"params": [log α], "lr": log_alpha_lr}`` as a second
    parameter group, which takes every other setting from the factory's defaults.

    >>> f = gate_optimizer_factory(functools.partial(torch.optim.SGD, lr=0.03, momentum=0.9), 10.0)
    >>> f.func.__name__, f.keywords
    ('SGD', {'lr': 10.0, 'momentum': 0.9})
    """
    if not isinstance(factory, functools.partial):
        return factory  # (refused by stacked_refusal)
    return functools.partial(factory.func, *factory.args, **{**factory.keywords, "lr": float(lr)})


def stacked_refusal(method: EFLoPS) -> str | None:
    """Why :func:`stacked_client_updates` would not reproduce ``method``'s ``client_update`` (``None``: it does).

    One sentence, without a final full stop, naming the config key.
    """
    if method.off_support_gates.regrows:
        return (
            f"method.off_support_gates={method.off_support_gates.name} sums each client's gradients at its closed "
            "coordinates to regrow them, which the stacked clients do not reproduce"
        )
    factory = method.round_client_optimizer
    why = optimiser_refusal(factory)
    if why:
        return why.rstrip(".")
    why = optimiser_refusal(gate_optimizer_factory(factory, method.log_alpha_lr))
    if why:
        return f"method.log_alpha_lr={method.log_alpha_lr} makes the gates' optimiser unstackable: {why.rstrip('.')}"
    return randomness_refusal(method)


def _rows(values: Tensor, like: Tensor) -> Tensor:
    """(K,) ``values`` shaped to broadcast over ``like`` (K, ...)."""
    return values.reshape((-1,) + (1,) * (like.dim() - 1))


def stacked_client_updates(method: EFLoPS, *, round_idx: int, share: list[int], received: Tensor) -> list[ClientResult]:
    """:meth:`EFLoPS.client_update` of every client of ``share`` at once, from the decoded broadcast ``received``.

    Returns each client's result in ``share`` order (upload, samples, mean data loss, last local
    density) and records the first-step losses of the clients that took a step.
    """
    device = received.device
    model = method.client_model
    model.train()
    named = dict(model.named_parameters())
    names, sizes = list(named), [p.numel() for p in named.values()]
    k = len(share)

    # Each client's batches, drawn as the loop draws them, padded into one plan.
    data = share_data(method, share=share, round_idx=round_idx)
    xs, ys = data.x, data.y
    dm = method.datamodule
    x_all = torch.cat(xs)
    x_all = dm.transform(x_all) if hasattr(dm, "transform") else x_all  # the base class's augment: transform only
    y_all = torch.cat(ys)
    plan = data.plan(method.batch_size)
    index, mask = plan.index.to(device), plan.mask.to(device)
    active = plan.active.to(device)  # (plan.active stays on the host for the optimisers)
    counts = mask.sum(dim=2).clamp(min=1).to(torch.float32)

    # The received state, as every client rebuilds it, stacked over the share.
    theta0, log_alpha0, lam0 = method.client_start(received, round_idx)
    params = {
        n: piece.reshape(p.shape).unsqueeze(0).expand(k, *p.shape).clone().requires_grad_(True)
        for (n, p), piece in zip(named.items(), torch.split(theta0, sizes), strict=True)
    }
    log_alpha = log_alpha0.unsqueeze(0).expand(k, -1).clone().requires_grad_(True)
    lagrange = torch.full((k,), float(lam0), dtype=torch.float64, device=device)  # the loop's Python floats

    factory = method.round_client_optimizer
    theta_opt: StackedOptimizer | None = stacked_optimizer(factory)
    gate_opt: StackedOptimizer | None = stacked_optimizer(gate_optimizer_factory(factory, method.log_alpha_lr))
    assert theta_opt is not None and gate_opt is not None, "stacked_refusal() was not asked"

    gates = [method.generator(round_idx, client_id, "gates") for client_id in share]
    temperature = method.temperature_at(round_idx)
    screening = method.off_support_gates.screening(round_idx)
    nonnegative = method.constraint.nonnegative
    loss_fn = per_sample_loss(method.task)
    hc = method.hc

    def client_loss(
        theta: dict[str, Tensor], la: Tensor, u: Tensor, xb: Tensor, yb: Tensor, mb: Tensor, count: Tensor, lam: Tensor
    ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """One client's batch loss as :meth:`EFLoPS.client_update` builds it, and its data loss, D and c."""
        z = hc.sample(la, u)
        gated = {n: theta[n] * zj.view_as(theta[n]) for n, zj in zip(names, torch.split(z, sizes), strict=True)}
        data_loss = (loss_fn(functional_call(model, gated, (xb,)), yb) * mb).sum() / count
        loss, dens, c = method.lagrangian(data_loss, la, lam, temperature)
        return loss, data_loss, dens, c

    batched = torch.func.vmap(client_loss)
    data_sum = torch.zeros(k, device=device)
    first_loss = torch.zeros(k, device=device)
    density = torch.full((k,), math.nan, device=device)
    half = torch.full((log_alpha.shape[1],), 0.5)  # the noise of a padded step (never used)
    for s in range(index.shape[1]):
        flags = plan.active[:, s].tolist()
        u = torch.stack([uniform_noise((method.dim,), g) if a else half for g, a in zip(gates, flags, strict=True)])
        u = u.to(device, non_blocking=True)
        idx, weights, lam = index[:, s], mask[:, s].to(torch.float32), lagrange.to(torch.float32)
        losses, data_losses, dens, cons = batched(
            params, log_alpha, u, x_all[idx], y_all[idx], weights, counts[:, s], lam
        )
        leaves = [*params.values(), log_alpha]
        grads = list(torch.autograd.grad(losses.sum(), leaves))
        on = active[:, s]
        with torch.no_grad():
            if method.max_grad_norm is not None:  # clip_grad_norm_ over both groups, per client
                norms = torch.stack([torch.linalg.vector_norm(g.reshape(k, -1), 2, dim=1) for g in grads], dim=1)
                coef = (method.max_grad_norm / (torch.linalg.vector_norm(norms, 2, dim=1) + 1e-6)).clamp(max=1.0)
                grads = [g * _rows(coef, g) for g in grads]
            theta_opt.step_(params, dict(zip(names, grads[:-1], strict=True)), plan.active[:, s])
            gate_opt.step_({"log_alpha": log_alpha}, {"log_alpha": grads[-1]}, plan.active[:, s])
            clamped = log_alpha.clamp(hc.log_alpha_min, hc.log_alpha_max)
            log_alpha.copy_(torch.where(_rows(on, log_alpha), clamped, log_alpha))
            if not screening:  # λ ← λ + η_λ c, in float64 as the loop's Python floats (two roundings)
                ascended = lagrange + cons.to(torch.float64) * method.lambda_lr
                if nonnegative:
                    ascended = ascended.clamp_min(0.0)
                lagrange = torch.where(on, ascended, lagrange)
            zero = torch.zeros_like(data_losses)
            data_sum += torch.where(on, data_losses.detach(), zero)
            density = torch.where(on, dens.detach(), density)
            if s == 0:
                first_loss = torch.where(on, losses.detach(), zero)

    steps = plan.steps.tolist()
    took = torch.tensor([n > 0 for n in steps], device=device)
    method.record_start_losses(first_loss[took])  # the received model's loss on each client's first batch
    theta = torch.cat([params[n].detach().reshape(k, -1) for n in names], dim=1)
    gates_out = log_alpha.detach()
    lams, densities = lagrange.tolist(), density.tolist()
    results = []
    for c in range(k):
        upload = method.upload_message(theta[c], gates_out[c], torch.tensor(lams[c]))
        metrics: dict[str, Any] = {"eflops/local_density": densities[c]}
        loss = data_sum[c] / max(steps[c], 1)
        results.append(ClientResult(upload=upload, num_samples=len(ys[c]), loss=loss, metrics=metrics))
    return results
