"""The ``fused`` backend: local steps of a fully connected ReLU network under cross-entropy, without autograd.

A client of FedAvg (arXiv 1602.05629) on a multilayer perceptron takes many small steps (the
"2NN" of that paper at batch 10 takes six per client and round on 600-sample clients), and at
that size autograd's fixed cost per step (recording the graph, allocating each gradient, then
adding it in a separate optimiser pass) is larger than the arithmetic. :func:`fused_sgd_step_`
does the same step by hand for a chain ``Linear → ReLU → … → Linear`` (optionally behind a
``Flatten``):

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
(:meth:`fedlightning.models.sampled_network.SampledNetwork.fused_gradient_`).
:func:`chain_refusal` says which models qualify: exactly
:class:`~fedlightning.models.mlp.MLP`, :class:`~fedlightning.models.linear.LogisticRegression`
or an ``nn.Sequential`` of ``Flatten``, ``Linear`` and ``ReLU`` (a parametrised layer, e.g. a
pruning mask, has another class), with no hooks and every parameter trained.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import pairwise
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fedlightning.errors import ConfigError
from fedlightning.federated.local.base import LocalProgram, LocalTraining, engine_base, overrides, own_local_work
from fedlightning.federated.local.loop import LoopRunner
from fedlightning.federated.local.steps import in_place_step, sgd_step_
from fedlightning.models.linear import LogisticRegression
from fedlightning.models.mlp import MLP

if TYPE_CHECKING:
    from fedlightning.federated.module import FederatedModule

__all__ = [
    "FusedRunner",
    "Pair",
    "SGDSettings",
    "chain_gradients_",
    "chain_refusal",
    "cross_entropy_chain_refusal",
    "fused_sgd_step_",
    "linear_chain",
    "plain_sgd_rates",
    "sgd_settings",
]

_THRESHOLD_BACKWARD = torch.ops.aten.threshold_backward.default

Pair = tuple[Tensor, Tensor | None]
"""A layer's (weight, bias); the bias may be absent."""


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


def hand_step_owner(cls: type) -> type:
    """The class whose local work the fused backend serves for ``cls``.

    The nearest class that declares ``hand_stepped = True`` (its clients take their steps by
    hand on :attr:`FusedRunner.layers`), else the engine's base class, which declares it false.
    """
    declared = [c for c in cls.__mro__ if "hand_stepped" in vars(c)]
    for c in declared:
        if vars(c)["hand_stepped"]:
            return c
    return declared[-1]


def cross_entropy_chain_refusal(module: FederatedModule) -> str | None:
    """Why the client model's cross-entropy steps cannot be taken by hand, whatever updates it (``None``: they can)."""
    loss = module.loss_fn
    plain = type(loss) is nn.CrossEntropyLoss and loss.weight is None and loss.reduction == "mean"
    if not plain or loss.label_smoothing:
        return "its loss is not the plain cross-entropy"
    trainer = module.attached_trainer
    precision = str(getattr(trainer, "precision", "32-true")) if trainer is not None else "32-true"
    if "mixed" in precision:
        return f"trainer.precision={precision} runs the forward pass under autocast"
    if torch.is_autocast_enabled(module.device.type):
        return "autocast is enabled, whose casts a hand-taken step would skip"
    reason = chain_refusal(module.client_model)
    return None if reason is None else f"its model cannot: {reason}"


def _unserved_optimizer(optimizer: torch.optim.Optimizer, layers: Sequence[nn.Linear]) -> str | None:
    """Why :func:`fused_sgd_step_` and :func:`sgd_step_` cannot take ``optimizer``'s steps of ``layers``."""
    if in_place_step(optimizer) is not sgd_step_:
        return "the client optimiser is not a plain torch.optim.SGD without step hooks"
    trained = {id(p) for group in optimizer.param_groups for p in group["params"]}
    if trained != {id(p) for layer in layers for p in layer.parameters()}:
        return "the client optimiser does not train exactly the model's parameters"
    return None


class FusedRunner(LoopRunner):
    """``fused``: each client in turn, each step by :func:`fused_sgd_step_` (or the method's own hand-taken step).

    It serves the engine's default local work under plain ``torch.optim.SGD`` without
    clipping, and methods that declare ``hand_stepped`` (their steps are taken by hand on
    :attr:`layers`, e.g. Zampling's :meth:`~fedlightning.models.sampled_network.SampledNetwork.fused_gradient_`)
    with any client optimiser.
    """

    name = "fused"

    def __init__(self, *, strict: bool = False) -> None:
        super().__init__(strict=strict)
        self._layers: list[nn.Linear] | None = None

    def refusal(self, module: FederatedModule) -> str | None:
        owner = hand_step_owner(type(module))
        own = own_local_work(type(module), owner, module.local_work_hooks, "the engine's cross-entropy steps")
        if own:
            return own
        if overrides(type(module), engine_base(type(module)), "local_penalty"):
            return "its local loss adds a term (local_penalty) that the hand-taken steps do not differentiate"
        if not owner.hand_stepped:  # type: ignore[attr-defined]
            if module.max_grad_norm is not None:
                return "method.max_grad_norm clips each gradient"
            if sgd_settings(module.round_client_optimizer) is None:
                return "its client optimiser is not torch.optim.SGD (method.client_optimizer)"
        return cross_entropy_chain_refusal(module)

    @property
    def layers(self) -> list[nn.Linear] | None:
        return self._layers

    def begin_round(self, module: FederatedModule) -> None:
        self._layers = linear_chain(module.client_model)

    def train(self, module: FederatedModule, *, client_id: int, round_idx: int, program: LocalProgram) -> LocalTraining:
        optimizer = module.make_client_optimizer(program.params, client_id=client_id, round_idx=round_idx)
        layers = self._layers
        assert layers is not None, "begin_round was not called"
        if program.writes_gradients:  # the method's own hand-taken step; the optimiser applies it as usual
            return self._autograd_steps(
                module, client_id=client_id, round_idx=round_idx, program=program, optimizer=optimizer
            )
        why = _unserved_optimizer(optimizer, layers)
        if why is not None:
            if self.strict:
                raise ConfigError(
                    f"local_execution=fused cannot take {type(module).__name__}'s local steps: {why}; "
                    "set local_execution=auto or loop."
                )
            return self._autograd_steps(
                module, client_id=client_id, round_idx=round_idx, program=program, optimizer=optimizer
            )
        rates = plain_sgd_rates(optimizer, layers)

        def step(x: Tensor, y: Tensor) -> Tensor:
            # plain SGD (rates): forward, backward and update in one pass; else gradients, then the step
            loss = fused_sgd_step_(layers, x, y, rates=rates)
            if rates is None:
                sgd_step_(optimizer)
            return loss

        return self._run_steps(
            module, client_id=client_id, round_idx=round_idx, program=program, step=step, optimizer=optimizer
        )
