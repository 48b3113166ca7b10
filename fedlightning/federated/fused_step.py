"""One local step of a fully connected ReLU network under cross-entropy, without autograd.

A client of FedAvg (arXiv 1602.05629) on a multilayer perceptron takes many small steps (the
"2NN" of that paper at batch 10: six steps per client and round in workload S2 of
``benchmarks/``), and at that size autograd's fixed cost per step (recording the graph,
allocating each gradient, then adding it in a separate optimiser pass) is larger than the
arithmetic. :func:`fused_sgd_step_` does the same step by hand for a chain
``Linear → ReLU → … → Linear`` (optionally behind a ``Flatten``):

* forward: hₗ = ReLU(hₗ₋₁Wₗᵀ + bₗ), keeping every layer's input; logits z;
* loss: the batch mean of −log softmax(z)_y, computed as ``cross_entropy`` does;
* backward: δ = (softmax(z) − onehot(y)) / B at the logits, δₗ₋₁ = (δₗWₗ) ⊙ [hₗ₋₁ > 0]
  through each ReLU, each computed from the weights before the update;
* update, plain SGD: Wₗ ← Wₗ − γ δₗᵀhₗ₋₁ as one ``addmm_`` and bₗ ← bₗ − γ Σ δₗ, so no
  gradient tensor is written; with momentum or weight decay the gradients are written to
  ``.grad`` instead and the optimiser steps as usual.

The step equals ``loss.backward()`` followed by ``optimizer.step()`` up to float rounding
(``tests/test_fused_step.py`` checks weights, gradients and losses against autograd).
:func:`chain_gradients_` runs the same forward and backward on given (weight, bias) tensors and
writes the gradients into given tensors: Zampling's clients (arXiv 2503.14246), whose weights
are slices of w = Q·z, take their steps with it
(:meth:`fedlightning.methods.zampling.SampledNetwork.fused_gradient_`).
:func:`chain_refusal` says which models qualify: exactly
:class:`~fedlightning.models.mlp.MLP`, :class:`~fedlightning.models.linear.LogisticRegression`
or an ``nn.Sequential`` of ``Flatten``, ``Linear`` and ``ReLU`` (a parametrised layer, e.g. a
pruning mask, has another class), with no hooks and every parameter trained.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from itertools import pairwise

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fedlightning.models.linear import LogisticRegression
from fedlightning.models.mlp import MLP

__all__ = ["Pair", "chain_gradients_", "chain_refusal", "fused_sgd_step_", "linear_chain", "plain_sgd_rates"]

_THRESHOLD_BACKWARD = torch.ops.aten.threshold_backward.default

Pair = tuple[Tensor, Tensor | None]
"""A layer's (weight, bias); the bias may be absent."""


def _chain_modules(model: nn.Module) -> list[nn.Module] | str:
    """The modules the model applies in order, or why its forward pass is not a plain chain."""
    if type(model) is MLP:
        return list(model.net)
    if type(model) is LogisticRegression:
        return [model.flatten, model.linear]
    if type(model) is nn.Sequential:
        return list(model)
    return f"{type(model).__name__} is not an MLP, a LogisticRegression or an nn.Sequential"


def chain_refusal(model: nn.Module) -> str | None:
    """Why :func:`fused_sgd_step_` cannot train ``model`` (``None``: it can).

    >>> chain_refusal(MLP(in_features=4, hidden=[3], num_classes=2)) is None
    True
    >>> chain_refusal(nn.Sequential(nn.Linear(4, 3), nn.Tanh(), nn.Linear(3, 2)))
    'its layer Tanh is not Flatten, Linear or ReLU'
    """
    modules = _chain_modules(model)
    if isinstance(modules, str):
        return modules
    kinds = [type(m) for m in modules]
    odd = [k.__name__ for k in kinds if k not in (nn.Flatten, nn.Linear, nn.ReLU)]
    if odd:
        return f"its layer {odd[0]} is not Flatten, Linear or ReLU"
    if nn.Flatten in kinds[1:]:
        return "it flattens after its first layer"
    core = [k for k in kinds if k is not nn.Flatten]
    if not core or core[0] is not nn.Linear or core[-1] is not nn.Linear:
        return "it does not start and end with a Linear layer"
    if any(a is b for a, b in pairwise(core)):  # Linear-Linear or ReLU-ReLU
        return "its Linear layers are not separated by exactly one ReLU"
    if any(m.start_dim != 1 or m.end_dim != -1 for m in modules if isinstance(m, nn.Flatten)):
        return "its Flatten keeps more than the batch dimension"
    for m in model.modules():
        if m._forward_hooks or m._forward_pre_hooks or m._backward_hooks or m._backward_pre_hooks:
            return f"its {type(m).__name__} has hooks"
    for p in model.parameters():
        if not p.requires_grad:
            return "some of its parameters are frozen"
        if p._backward_hooks or getattr(p, "_post_accumulate_grad_hooks", None):
            return "some of its parameters have gradient hooks"
    return None


def linear_chain(model: nn.Module) -> list[nn.Linear]:
    """The ``Linear`` layers of a model that :func:`chain_refusal` accepts, input to output."""
    modules = _chain_modules(model)
    assert not isinstance(modules, str), modules
    return [m for m in modules if isinstance(m, nn.Linear)]


def plain_sgd_rates(optimizer: torch.optim.Optimizer, layers: Sequence[nn.Linear]) -> list[tuple[float, float]] | None:
    """Each layer's (weight, bias) step sizes when every group is SGD without momentum or weight decay.

    ``None`` otherwise: the fused step then writes gradients and the optimiser applies them.
    Every parameter of ``layers`` must be one of the optimiser's.

    >>> net = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))
    >>> opt = torch.optim.SGD([{"params": net[0].parameters()}, {"params": net[2].parameters(), "lr": 0.5}], lr=0.1)
    >>> plain_sgd_rates(opt, [net[0], net[2]])
    [(0.1, 0.1), (0.5, 0.5)]
    """
    rate: dict[int, float] = {}
    for group in optimizer.param_groups:
        if group["momentum"] != 0 or group["weight_decay"] != 0:
            return None
        rate.update((id(p), float(group["lr"])) for p in group["params"])
    return [(rate[id(layer.weight)], rate[id(layer.bias)] if layer.bias is not None else 0.0) for layer in layers]


def _forward_backward(
    pairs: Sequence[Pair], x: Tensor, y: Tensor, write: Callable[[int, Tensor, Tensor], None]
) -> Tensor:
    """Forward and backward through the chain; ``write(i, δᵢ, hᵢ₋₁)`` consumes layer i's gradient factors.

    Layer i's gradients are ∇W = δᵢᵀhᵢ₋₁ and ∇b = Σ δᵢ; ``write`` is called output layer first,
    after δᵢ₋₁ has been computed from Wᵢ, so it may update layer i in place.
    """
    inputs: list[Tensor] = []
    h = x.reshape(len(x), -1)
    last = len(pairs) - 1
    for i, (weight, bias) in enumerate(pairs):
        inputs.append(h)
        h = F.linear(h, weight, bias)
        if i < last:
            h = h.relu_()
    log_p = h.log_softmax(dim=1)
    loss = F.nll_loss(log_p, y)
    n = len(y)
    delta = log_p.exp_().div_(n)  # softmax(z) / B, in the buffer of log p (the loss is already taken)
    delta.sub_(F.one_hot(y, delta.shape[1]), alpha=1.0 / n)  # − onehot(y) / B (deterministic on every device)
    for i in range(last, -1, -1):
        h_in = inputs[i]
        # through the ReLU below, with autograd's own kernel: zero where its output h_in is 0
        below = _THRESHOLD_BACKWARD(delta @ pairs[i][0], h_in, 0) if i > 0 else None
        write(i, delta, h_in)
        if below is not None:
            delta = below
    return loss


@torch.no_grad()
def chain_gradients_(pairs: Sequence[Pair], x: Tensor, y: Tensor, *, out: Sequence[Pair]) -> Tensor:
    """The cross-entropy loss on ``(x, y)`` of the chain with layers ``pairs``; its gradients into ``out``.

    ``out`` holds a (weight, bias) tensor of the same shapes for every layer (views of one flat
    gradient vector, for instance); nothing else is written.

    >>> torch.manual_seed(0) is not None
    True
    >>> net = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))
    >>> x, y = torch.randn(5, 3), torch.tensor([0, 1, 1, 0, 1])
    >>> nn.functional.cross_entropy(net(x), y).backward()
    >>> pairs = [(net[0].weight, net[0].bias), (net[2].weight, net[2].bias)]
    >>> out = [(torch.empty_like(w), torch.empty_like(b)) for w, b in pairs]
    >>> loss = chain_gradients_(pairs, x, y, out=out)
    >>> bool(torch.allclose(out[0][0], net[0].weight.grad)), bool(torch.allclose(out[1][1], net[2].bias.grad))
    (True, True)
    """

    def write(i: int, delta: Tensor, h_in: Tensor) -> None:
        grad_weight, grad_bias = out[i]
        torch.mm(delta.t(), h_in, out=grad_weight)
        if grad_bias is not None:
            torch.sum(delta, 0, out=grad_bias)

    return _forward_backward(pairs, x, y, write)


@torch.no_grad()
def fused_sgd_step_(
    layers: Sequence[nn.Linear], x: Tensor, y: Tensor, *, rates: Sequence[tuple[float, float]] | None
) -> Tensor:
    """One cross-entropy step on the batch ``(x, y)`` of the chain ``layers``; returns the loss.

    ``rates`` gives each layer's (weight, bias) step size γ and the parameters are updated in
    place (W ← W − γ∇W); with ``rates=None`` the gradients are written to ``.grad`` and
    nothing is updated. The loss is that of the weights before the step.

    >>> torch.manual_seed(0) is not None
    True
    >>> net = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))
    >>> x, y = torch.randn(5, 3), torch.tensor([0, 1, 1, 0, 1])
    >>> expected = nn.functional.cross_entropy(net(x), y)
    >>> loss = fused_sgd_step_([net[0], net[2]], x, y, rates=None)
    >>> bool(torch.equal(loss, expected))
    True
    """
    pairs = [(layer.weight, layer.bias) for layer in layers]

    def write(i: int, delta: Tensor, h_in: Tensor) -> None:
        layer = layers[i]
        if rates is None:
            layer.weight.grad = delta.t() @ h_in
            if layer.bias is not None:
                layer.bias.grad = delta.sum(0)
        else:
            weight_rate, bias_rate = rates[i]
            layer.weight.addmm_(delta.t(), h_in, alpha=-weight_rate)
            if layer.bias is not None:
                layer.bias.add_(delta.sum(0), alpha=-bias_rate)

    return _forward_backward(pairs, x, y, write)
