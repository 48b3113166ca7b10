"""The local optimiser step of the engine's clients, without ``torch.optim``'s per-call wrappers.

A client takes a handful of small steps per round (workload S2: six steps of batch 10 per
client), so the fixed cost of each ``optimizer.step()`` call (profiler and dynamo-disable
wrappers, grad-mode switches, rebuilding the per-group lists, choosing an implementation) is a
visible part of a round. :func:`sgd_step_` applies the same update as ``torch.optim.SGD``'s
single-tensor path (weight decay, momentum with dampening, Nesterov) and :func:`adam_step_` the
same as ``torch.optim.Adam``'s (Kingma and Ba, arXiv 1412.6980; L2 weight decay), with the same
ops in the same order, keeping the optimiser's own ``state`` so its ``state_dict`` is the one
``step()`` would leave. :func:`in_place_step` says which of them gives exactly
``optimizer.step()``: a plain ``torch.optim.SGD`` or ``torch.optim.Adam`` with no step hooks and
no maximize/differentiable/fused/foreach/capturable/AMSGrad/AMP settings; anything else takes
its own ``step()``.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch.optim.optimizer import _get_scalar_dtype, _global_optimizer_post_hooks, _global_optimizer_pre_hooks

__all__ = ["adam_step_", "clear_grads_", "in_place_step", "sgd_step_", "steps_in_place"]


def steps_in_place(optimizer: torch.optim.Optimizer) -> bool:
    """Whether :func:`sgd_step_` gives exactly ``optimizer.step()``.

    >>> p = torch.nn.Parameter(torch.zeros(2))
    >>> steps_in_place(torch.optim.SGD([p], lr=0.1, momentum=0.9, nesterov=True))
    True
    >>> steps_in_place(torch.optim.SGD([p], lr=0.1, maximize=True)), steps_in_place(torch.optim.Adam([p]))
    (False, False)
    """
    return _plain(optimizer, torch.optim.SGD, ("lr", "momentum", "dampening", "weight_decay"))


def in_place_step(optimizer: torch.optim.Optimizer) -> Callable[[torch.optim.Optimizer], None] | None:
    """:func:`sgd_step_` or :func:`adam_step_` where it gives exactly ``optimizer.step()``, else ``None``.

    >>> p = torch.nn.Parameter(torch.zeros(2))
    >>> in_place_step(torch.optim.Adam([p], lr=0.1)) is adam_step_
    True
    >>> in_place_step(torch.optim.Adam([p], amsgrad=True)), in_place_step(torch.optim.AdamW([p]))
    (None, None)
    """
    if steps_in_place(optimizer):
        return sgd_step_
    if not _plain(optimizer, torch.optim.Adam, ("lr", "eps", "weight_decay")):
        return None
    for group in optimizer.param_groups:
        if group["amsgrad"] or group["capturable"] or group["foreach"] or group["decoupled_weight_decay"]:
            return None
        if any(isinstance(beta, torch.Tensor) for beta in group["betas"]):
            return None
        # (with foreach unset, torch takes its multi-tensor path for parameters off the CPU)
        if any(p.device.type != "cpu" or torch.is_complex(p) for p in group["params"]):
            return None
    return adam_step_


def _plain(optimizer: torch.optim.Optimizer, cls: type, scalars: tuple[str, ...]) -> bool:
    """``optimizer`` is exactly ``cls``, without hooks, AMP scaling, maximize/differentiable/fused or tensor scalars."""
    if type(optimizer) is not cls:  # a subclass may change step()
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
        if any(isinstance(group[k], torch.Tensor) for k in scalars):
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


@torch.no_grad()
def adam_step_(optimizer: torch.optim.Optimizer) -> None:
    """One ``torch.optim.Adam`` step (single-tensor update), in place; see :func:`in_place_step`.

    With step γ, β₁, β₂, ε and weight decay λ, for each parameter x with gradient g at step t:
    g ← g + λx; m ← m + (1 − β₁)(g − m); v ← β₂v + (1 − β₂)g²;
    x ← x − γ/(1 − β₁ᵗ) · m / (√v / √(1 − β₂ᵗ) + ε). Parameters without a gradient are skipped.

    >>> p = torch.nn.Parameter(torch.tensor([1.0]))
    >>> opt = torch.optim.Adam([p], lr=0.5)
    >>> p.grad = torch.tensor([2.0])
    >>> adam_step_(opt)
    >>> p.tolist(), opt.state[p]["step"].item()  # the first step moves by lr · sign(g), up to ε
    ([0.5000000596046448], 1.0)
    """
    groups = [(group, [p for p in group["params"] if p.grad is not None]) for group in optimizer.param_groups]
    if any(p.grad.is_sparse for _, params in groups for p in params):
        optimizer.step()  # torch's own path, which refuses sparse gradients with its sentence
        return
    for group, params in groups:
        (beta1, beta2), lr, eps, weight_decay = group["betas"], group["lr"], group["eps"], group["weight_decay"]
        for p in params:
            state = optimizer.state[p]
            if not state:
                state["step"] = torch.tensor(0.0, dtype=_get_scalar_dtype())
                state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            step_t, exp_avg, exp_avg_sq = state["step"], state["exp_avg"], state["exp_avg_sq"]
            step_t += 1
            g = p.grad if weight_decay == 0 else p.grad.add(p, alpha=weight_decay)
            exp_avg.lerp_(g, 1 - beta1)
            exp_avg_sq.mul_(beta2).addcmul_(g, g, value=1 - beta2)
            step = step_t.item()
            step_size = lr / (1 - beta1**step)
            denom = (exp_avg_sq.sqrt() / (1 - beta2**step) ** 0.5).add_(eps)
            p.addcdiv_(exp_avg, denom, value=-step_size)
