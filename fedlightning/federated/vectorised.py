"""The vectorised cohort: every client of a share trained at once on stacked parameters.

FedAvg's local work (McMahan et al., arXiv 1602.05629) is the same small program on each
client: steps of minibatch SGD from the broadcast. Here the K clients' parameters are stacked
along a leading client axis and one step of all K clients is one ``torch.func.vmap`` of
``torch.func.functional_call`` over (parameters, batch), one backward pass, and one SGD update
written on the stacked tensors. Unequal clients are padded:

* batches are padded to the batch size with a sample mask (a short last batch counts only its
  own samples, its loss is the mean over them, as in the sequential loop);
* clients with fewer steps are padded with inactive steps whose update is masked out entirely
  (no weight decay, no momentum change), so each client takes exactly its own steps.

The batch schedules are the sequential path's own (each client's ``batches`` stream), so both
paths see the same batches and agree within float rounding. Served: the engine's default
``client_update`` / ``local_train`` / ``local_loss`` with ``torch.optim.SGD`` (momentum,
dampening, Nesterov, weight decay), cross-entropy or squared error, ``max_grad_norm``, models
without buffers (GroupNorm is fine). It is the accelerator path: on a CPU the loop is as fast.

>>> active = torch.tensor([True, False])
>>> p, g = torch.ones(2, 3), torch.ones(2, 3)
>>> stacked_sgd_step_(p, g, None, active=active, lr=0.5, momentum=0.0, dampening=0.0, nesterov=False, weight_decay=0.0)
>>> p.tolist()
[[0.5, 0.5, 0.5], [1.0, 1.0, 1.0]]
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor, nn

__all__ = ["SGDSettings", "StepPlan", "plan_steps", "sgd_settings", "stacked_sgd_step_", "train_stacked"]


@dataclass(frozen=True)
class SGDSettings:
    """The hyper-parameters of ``torch.optim.SGD`` that the stacked update implements."""

    lr: float
    momentum: float = 0.0
    dampening: float = 0.0
    nesterov: bool = False
    weight_decay: float = 0.0


def sgd_settings(factory: Callable[..., torch.optim.Optimizer]) -> SGDSettings | None:
    """The SGD settings of a plain ``functools.partial(torch.optim.SGD, ...)``, else ``None``.

    >>> sgd_settings(functools.partial(torch.optim.SGD, lr=0.1, momentum=0.9))
    SGDSettings(lr=0.1, momentum=0.9, dampening=0.0, nesterov=False, weight_decay=0.0)
    >>> sgd_settings(functools.partial(torch.optim.Adam, lr=0.1)) is None
    True
    """
    if not isinstance(factory, functools.partial) or factory.func is not torch.optim.SGD or factory.args:
        return None
    kwargs = dict(factory.keywords)
    if kwargs.pop("maximize", False) or kwargs.pop("differentiable", False):
        return None
    for ignored in ("foreach", "fused"):  # implementation choices, the same update
        kwargs.pop(ignored, None)
    names = {"lr", "momentum", "dampening", "nesterov", "weight_decay"}
    if "lr" not in kwargs or not set(kwargs) <= names:
        return None
    return SGDSettings(
        lr=float(kwargs["lr"]),
        momentum=float(kwargs.get("momentum", 0.0)),
        dampening=float(kwargs.get("dampening", 0.0)),
        nesterov=bool(kwargs.get("nesterov", False)),
        weight_decay=float(kwargs.get("weight_decay", 0.0)),
    )


@dataclass(frozen=True)
class StepPlan:
    """The padded batch schedule of K clients.

    Attributes:
        index: (K, S, B) positions into the concatenated client data (0 where padded).
        mask: (K, S, B) whether a position holds a real sample.
        active: (K, S) whether client k takes step s.
        steps: (K,) the number of steps of each client.
    """

    index: Tensor
    mask: Tensor
    active: Tensor
    steps: Tensor


def plan_steps(schedules: Sequence[Sequence[Tensor]], offsets: Sequence[int], batch_size: int) -> StepPlan:
    """Pad K clients' index batches into one :class:`StepPlan` (``offsets``: where each client's data starts).

    >>> plan = plan_steps([[torch.tensor([1, 0]), torch.tensor([2])], [torch.tensor([0])]], [0, 3], 2)
    >>> plan.index.tolist(), plan.mask.int().tolist(), plan.steps.tolist()
    ([[[1, 0], [2, 0]], [[3, 0], [0, 0]]], [[[1, 1], [1, 0]], [[1, 0], [0, 0]]], [2, 1])
    """
    k = len(schedules)
    s = max((len(b) for b in schedules), default=0)
    index = torch.zeros(k, s, batch_size, dtype=torch.long)
    mask = torch.zeros(k, s, batch_size, dtype=torch.bool)
    for c, (batches, offset) in enumerate(zip(schedules, offsets, strict=True)):
        for step, idx in enumerate(batches):
            index[c, step, : len(idx)] = idx + offset
            mask[c, step, : len(idx)] = True
    active = mask.any(dim=2)
    return StepPlan(index=index, mask=mask, active=active, steps=active.sum(dim=1))


def stacked_sgd_step_(
    p: Tensor,
    g: Tensor,
    buf: Tensor | None,
    *,
    active: Tensor,
    lr: float,
    momentum: float,
    dampening: float,
    nesterov: bool,
    weight_decay: float,
) -> Tensor | None:
    """One ``torch.optim.SGD`` step of stacked parameters ``p`` (K, ...) in place, where ``active`` (K,).

    The same arithmetic as ``torch.optim.SGD``'s single-tensor step, on all K clients at once,
    without new (K, ...) tensors: the gradient ``g`` is overwritten, and the momentum buffer
    (``None`` before the first step, then the returned tensor) is updated in place. A client
    that is not active keeps its parameters and buffer (its rows get a zero update).
    """
    everyone = bool(active.all())
    on = active.reshape((-1,) + (1,) * (p.dim() - 1))
    d = g if weight_decay == 0 else g.add_(p, alpha=weight_decay)
    if momentum != 0:
        if buf is None:  # torch.optim.SGD's first step: the buffer is the gradient
            buf = d.clone()
        elif everyone:
            buf.mul_(momentum).add_(d, alpha=1 - dampening)
        else:
            buf.copy_(torch.where(on, buf * momentum + d * (1 - dampening), buf))
        d = d.add_(buf, alpha=momentum) if nesterov else buf
    p.add_(d if everyone else d * on, alpha=-lr)
    return buf


def _per_sample_loss(task: str) -> Callable[[Tensor, Tensor], Tensor]:
    if task == "classification":
        return lambda out, y: nn.functional.cross_entropy(out, y, reduction="none")
    return lambda out, y: (out.reshape(y.shape) - y) ** 2


def train_stacked(
    *,
    model: nn.Module,
    start: dict[str, Tensor],
    x: Tensor,
    y: Tensor,
    plan: StepPlan,
    settings: SGDSettings,
    task: str,
    max_grad_norm: float | None,
) -> tuple[dict[str, Tensor], Tensor, Tensor]:
    """Local SGD of K clients at once from the same ``start`` parameters.

    Args:
        model: the architecture (its own parameters are not used or changed).
        start: parameter name -> tensor, the received model.
        x, y: the concatenated data of the K clients (``plan.index`` points into them).
        plan: the padded schedule.
        settings: the client optimiser.
        task: ``classification`` (cross-entropy) or ``regression`` (squared error).
        max_grad_norm: per-client clipping of each step's gradient (as ``clip_grad_norm_``).

    Returns:
        The final stacked parameters (name -> (K, ...)), each client's first-step loss (K,)
        and each client's mean loss over its steps (K,).
    """
    k, steps, _ = plan.index.shape
    names = list(start)
    params = {n: start[n].detach().unsqueeze(0).expand(k, *start[n].shape).clone() for n in names}
    buffers: dict[str, Tensor | None] = dict.fromkeys(names)
    loss_fn = _per_sample_loss(task)
    device = x.device
    index, mask, active = plan.index.to(device), plan.mask.to(device), plan.active.to(device)
    counts = mask.sum(dim=2).clamp(min=1).to(x.dtype if x.is_floating_point() else torch.float32)

    def client_loss(p: dict[str, Tensor], xb: Tensor, yb: Tensor, mb: Tensor, count: Tensor) -> Tensor:
        out = torch.func.functional_call(model, p, (xb,))
        per = loss_fn(out, yb)
        return (per * mb).sum() / count

    batched = torch.func.vmap(client_loss)
    loss_sum = torch.zeros(k, device=device)
    first_loss = torch.zeros(k, device=device)
    for n in names:
        params[n].requires_grad_(True)  # leaves of every step's graph, updated in place between steps
    for s in range(steps):
        idx = index[:, s]
        xb, yb = x[idx], y[idx]
        mb = mask[:, s].to(counts.dtype)
        losses = batched(params, xb, yb, mb, counts[:, s])
        grads = torch.autograd.grad(losses.sum(), [params[n] for n in names])
        on = active[:, s]
        with torch.no_grad():
            if max_grad_norm is not None:
                norms = torch.sqrt(sum(g.reshape(k, -1).pow(2).sum(dim=1) for g in grads))  # type: ignore[arg-type]
                coef = (max_grad_norm / (norms + 1e-6)).clamp(max=1.0)
                grads = tuple(g * coef.reshape((-1,) + (1,) * (g.dim() - 1)) for g in grads)
            for n, g in zip(names, grads, strict=True):
                buffers[n] = stacked_sgd_step_(
                    params[n],
                    g,
                    buffers[n],
                    active=on,
                    lr=settings.lr,
                    momentum=settings.momentum,
                    dampening=settings.dampening,
                    nesterov=settings.nesterov,
                    weight_decay=settings.weight_decay,
                )
            step_loss = torch.where(on, losses.detach(), torch.zeros_like(losses))
            loss_sum += step_loss
            if s == 0:
                first_loss = step_loss.clone()
    mean_loss = loss_sum / plan.steps.to(device).clamp(min=1).to(loss_sum.dtype)
    return {n: params[n].detach() for n in names}, first_loss, mean_loss
