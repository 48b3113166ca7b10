"""The local optimiser step of the engine's clients, without ``torch.optim``'s per-call wrappers.

A client takes a handful of small steps per round (workload S2: six steps of batch 10 per
client), so the fixed cost of each ``torch.optim.SGD.step()`` call (profiler and dynamo-disable
wrappers, grad-mode switches, rebuilding the per-group lists) is a visible part of a round.
:func:`sgd_step_` applies the same update as ``torch.optim.SGD``'s single-tensor path
(weight decay, momentum with dampening, Nesterov), with the same ops in the same order, and
keeps the momentum buffers in the optimiser's own ``state`` so its ``state_dict`` is the one
``step()`` would leave. :func:`steps_in_place` says when that is exact: a plain
``torch.optim.SGD`` with no step hooks and no maximize/differentiable/fused/AMP settings;
anything else takes its own ``step()``.
"""

from __future__ import annotations

import torch
from torch.optim.optimizer import _global_optimizer_post_hooks, _global_optimizer_pre_hooks

__all__ = ["clear_grads_", "sgd_step_", "steps_in_place"]


def steps_in_place(optimizer: torch.optim.Optimizer) -> bool:
    """Whether :func:`sgd_step_` gives exactly ``optimizer.step()``.

    >>> p = torch.nn.Parameter(torch.zeros(2))
    >>> steps_in_place(torch.optim.SGD([p], lr=0.1, momentum=0.9, nesterov=True))
    True
    >>> steps_in_place(torch.optim.SGD([p], lr=0.1, maximize=True)), steps_in_place(torch.optim.Adam([p]))
    (False, False)
    """
    if type(optimizer) is not torch.optim.SGD:  # a subclass may change step()
        return False
    if optimizer._optimizer_step_pre_hooks or optimizer._optimizer_step_post_hooks:
        return False
    if _global_optimizer_pre_hooks or _global_optimizer_post_hooks:
        return False
    if getattr(optimizer, "grad_scale", None) is not None or getattr(optimizer, "found_inf", None) is not None:
        return False
    for group in optimizer.param_groups:
        if group["maximize"] or group["differentiable"] or group.get("fused"):
            return False
        if any(isinstance(group[k], torch.Tensor) for k in ("lr", "momentum", "dampening", "weight_decay")):
            return False
    return True


def clear_grads_(params: list[torch.nn.Parameter]) -> None:
    """``optimizer.zero_grad(set_to_none=True)`` for the optimiser's parameters ``params``."""
    for p in params:
        p.grad = None


@torch.no_grad()
def sgd_step_(optimizer: torch.optim.Optimizer) -> None:
    """One ``torch.optim.SGD`` step (single-tensor update), in place; see :func:`steps_in_place`.

    With momentum μ, dampening τ, weight decay λ and step γ, for each parameter x with
    gradient g: g ← g + λx; b ← g on the first step, else b ← μb + (1 − τ)g; the direction is
    g + μb (Nesterov) or b; x ← x − γ · direction. Parameters without a gradient are skipped.

    >>> p = torch.nn.Parameter(torch.tensor([1.0]))
    >>> opt = torch.optim.SGD([p], lr=0.5, momentum=0.5)
    >>> for _ in range(2):
    ...     p.grad = torch.tensor([2.0])
    ...     sgd_step_(opt)
    >>> p.tolist(), opt.state[p]["momentum_buffer"].tolist()  # 1 - 0.5*2, then 0 - 0.5*(0.5*2 + 2)
    ([-1.5], [3.0])
    """
    groups = [(group, [p for p in group["params"] if p.grad is not None]) for group in optimizer.param_groups]
    if any(p.grad.is_sparse for _, params in groups for p in params):
        optimizer.step()  # sparse gradients take torch's own path
        return
    for group, params in groups:
        if not params:
            continue
        grads = [p.grad for p in params]
        lr, momentum, weight_decay = group["lr"], group["momentum"], group["weight_decay"]
        if momentum == 0 and weight_decay == 0:
            torch._foreach_add_(params, grads, alpha=-lr)
            continue
        dampening, nesterov = group["dampening"], group["nesterov"]
        for p, g in zip(params, grads, strict=True):
            if weight_decay != 0:
                g = g.add(p, alpha=weight_decay)
            if momentum != 0:
                state = optimizer.state[p]
                buf = state.get("momentum_buffer")
                if buf is None:
                    buf = g.detach().clone()
                    state["momentum_buffer"] = buf
                else:
                    buf.mul_(momentum).add_(g, alpha=1 - dampening)
                g = g.add(buf, alpha=momentum) if nesterov else buf
            p.add_(g, alpha=-lr)
