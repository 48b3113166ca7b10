"""The optimiser state of K stacked clients: ``torch.optim`` SGD, Adam and AdamW on a client axis.

The vectorised cohort trains K clients at once on parameters stacked along a leading client axis
(K, ...). Each class here keeps, for every client, the state that the client's own
``torch.optim`` optimiser would keep, and applies the update of torch's single-tensor
implementation (``torch.optim.sgd._single_tensor_sgd``; the non-capturable branch of
``torch.optim.adam._single_tensor_adam``) with the same ops in the same order, so that each
client's parameters equal those of ``torch.optim.X`` run on that client alone; on the CPU in
float32 and float64 they agree bit for bit (tests/test_stacked_optim.py).

Clients take unequal numbers of steps, padded to a common plan: each step's ``active`` (K,)
mask says which clients take it. An inactive client keeps its parameters and its state
exactly. Its step count does not advance (Adam's bias corrections use each client's own count),
and its SGD momentum buffer starts as the gradient at its first *active* step.

Served: ``functools.partial`` factories (Hydra's ``_partial_: true``) of ``torch.optim.SGD``
(lr, momentum, dampening, nesterov, weight_decay), ``torch.optim.Adam`` (Kingma and Ba,
arXiv 1412.6980; lr, betas, eps, L2 weight_decay, decoupled_weight_decay) and
``torch.optim.AdamW`` (Loshchilov and Hutter, arXiv 1711.05101). ``foreach`` and ``fused`` are
accepted as implementation choices; AMSGrad, maximize, differentiable, capturable and tensor
hyper-parameters are not served (:func:`refusal` says why).

>>> sgd = stacked_optimizer(functools.partial(torch.optim.SGD, lr=0.5, momentum=0.5))
>>> p = {"w": torch.zeros(2, 1)}
>>> for active in ([True, False], [True, True]):
...     sgd.step_(p, {"w": torch.full((2, 1), 2.0)}, torch.tensor(active))
>>> p["w"].flatten().tolist()  # client 0: -0.5·2, then -1 - 0.5·(0.5·2 + 2); client 1 starts at step 2
[-2.5, -1.0]
>>> adam = stacked_optimizer(functools.partial(torch.optim.Adam, lr=0.1))
>>> p = {"w": torch.zeros(2, 1)}
>>> adam.step_(p, {"w": torch.tensor([[3.0], [-5.0]])}, torch.tensor([True, False]))
>>> [round(x, 6) for x in p["w"].flatten().tolist()]  # Adam's first step: -lr·sign(g), up to ε
[-0.1, 0.0]
"""

from __future__ import annotations

import abc
import functools
from collections.abc import Callable, Mapping
from typing import Any, ClassVar, Self

import torch
from torch import Tensor

__all__ = ["StackedAdam", "StackedAdamW", "StackedOptimizer", "StackedSGD", "refusal", "stacked_optimizer"]

_KEY = "method.client_optimizer"
_IMPLEMENTATION = frozenset({"foreach", "fused"})  # how torch computes, not what: accepted
_MUST_BE_OFF = ("amsgrad", "maximize", "differentiable", "capturable")


class StackedOptimizer(abc.ABC):
    """A client optimiser applied to K clients at once, with per-client state.

    Attributes:
        state: parameter name -> that parameter's stacked state (each tensor (K, ...) or (K,)),
            created at the first :meth:`step_` that names the parameter.
    """

    optimizer: ClassVar[type[torch.optim.Optimizer]]
    keywords: ClassVar[frozenset[str]]

    lr: float

    def __init__(self) -> None:
        self.client_lr: list[float] | None = None
        """Each client's learning rate where they differ (:meth:`set_client_lr`); ``None``: :attr:`lr` for all."""
        self.state: dict[str, dict[str, Tensor]] = {}
        self._counts: dict[str, list[int]] = {}  # active steps taken by each client, on the host
        self._cache: dict[tuple[Any, ...], Tensor] = {}  # small per-step tensors shared by the parameters

    @classmethod
    def from_factory(cls, factory: Callable[..., torch.optim.Optimizer]) -> Self | None:
        """The stacked form of ``factory`` (a ``functools.partial`` of :attr:`optimizer`), else ``None``."""
        group = cls._group(factory)
        return None if isinstance(group, str) else cls._from_group(group)

    @classmethod
    def refusal(cls, factory: Callable[..., torch.optim.Optimizer]) -> str:
        """One sentence on why :meth:`from_factory` refuses ``factory``; ``""`` where it is served."""
        group = cls._group(factory)
        return group if isinstance(group, str) else ""

    @classmethod
    @abc.abstractmethod
    def _from_group(cls, group: Mapping[str, Any]) -> Self:
        """The instance for a validated ``param_groups[0]`` of :attr:`optimizer`."""

    @classmethod
    def _group(cls, factory: Callable[..., torch.optim.Optimizer]) -> dict[str, Any] | str:
        """The hyper-parameters of ``factory`` as torch fills them in, or the reason it is refused."""
        name = f"torch.optim.{cls.optimizer.__name__}"
        if not isinstance(factory, functools.partial):
            return f"{_KEY} must be a functools.partial (Hydra `_partial_: true`) of {name}, not {factory!r}."
        if factory.func is not cls.optimizer:
            return f"{_KEY} is {_describe(factory)}, and {cls.__name__} serves only {name}."
        if factory.args:
            return f"{_KEY} {_describe(factory)} passes positional arguments; give its settings by keyword."
        kwargs = dict(factory.keywords)
        unknown = sorted(set(kwargs) - cls.keywords - _IMPLEMENTATION)
        if unknown:
            return f"{_KEY} {_describe(factory)} sets {', '.join(unknown)}, which {cls.__name__} does not implement."
        on = [k for k in _MUST_BE_OFF if kwargs.get(k)]
        if on:
            return f"{_KEY} {_describe(factory)} turns on {', '.join(on)}, which {cls.__name__} does not implement."
        tensors = [k for k, v in kwargs.items() if _has_tensor(v)]
        if tensors:
            return f"{_KEY} {_describe(factory)} gives {', '.join(tensors)} as tensors; {cls.__name__} takes numbers."
        settings = {k: v for k, v in kwargs.items() if k not in _IMPLEMENTATION}
        try:  # torch's own validation and defaults
            group = cls.optimizer([torch.nn.Parameter(torch.zeros(1))], **settings).param_groups[0]
        except (TypeError, ValueError) as error:
            return f"{_KEY} {_describe(factory)} is rejected by torch: {error}."
        return {k: v for k, v in group.items() if k != "params"}

    def set_client_lr(self, lrs: list[float]) -> None:
        """Give client k the learning rate ``lrs[k]`` (e.g. a step size scaled to its local work).

        Each client's update is then computed with its own rate as a Python float, as its own
        ``torch.optim`` optimiser would.
        """
        self.client_lr = None if len(set(lrs)) <= 1 and (not lrs or lrs[0] == self.lr) else [float(v) for v in lrs]

    def _client_lrs(self, k: int) -> list[float]:
        return self.client_lr if self.client_lr is not None else [self.lr] * k

    @torch.no_grad()
    def step_(self, params: dict[str, Tensor], grads: dict[str, Tensor], active: Tensor) -> None:
        """One optimiser step of every active client, in place on the stacked ``params``.

        Args:
            params: name -> stacked parameters (K, ...), updated in place.
            grads: name -> their gradients (K, ...), not modified.
            active: (K,) bool, which clients take this step; the others keep parameters and state
                bit for bit. It is read on the host: pass it on the CPU to avoid a device sync.
        """
        flags = [bool(a) for a in active.tolist()]
        k = len(flags)
        everyone = all(flags)
        self._cache.clear()
        for name, p in params.items():
            g = grads[name]
            if p.shape[:1] != (k,) or g.shape != p.shape:
                raise ValueError(f"{name}: parameters {tuple(p.shape)} and gradients {tuple(g.shape)} for {k} clients")
            counts = self._counts.setdefault(name, [0] * k)
            before = list(counts)
            for c in range(k):
                counts[c] += flags[c]
            key = ("active", p.device)
            if key not in self._cache:
                self._cache[key] = active.to(device=p.device, dtype=torch.bool)
            on = self._cache[key].reshape((k,) + (1,) * (p.dim() - 1))
            self._update(name, p, g, on=on, everyone=everyone, before=before, after=counts)

    @abc.abstractmethod
    def _update(
        self, name: str, p: Tensor, g: Tensor, *, on: Tensor, everyone: bool, before: list[int], after: list[int]
    ) -> None:
        """Step parameter ``name``; ``before``/``after``: each client's active steps before and after this one."""


class StackedSGD(StackedOptimizer):
    """``torch.optim.SGD`` (momentum, dampening, Nesterov, L2 weight decay) of K stacked clients.

    Per client: g ← g + λx; b ← g at the client's first active step, else b ← μb + (1 − τ)g;
    x ← x − γ·(g + μb) (Nesterov) or x − γ·b. State: ``momentum_buffer`` (K, ...) where μ ≠ 0.
    """

    optimizer = torch.optim.SGD
    keywords = frozenset({"lr", "momentum", "dampening", "nesterov", "weight_decay", "maximize", "differentiable"})

    def __init__(
        self,
        *,
        lr: float,
        momentum: float = 0.0,
        dampening: float = 0.0,
        nesterov: bool = False,
        weight_decay: float = 0.0,
    ) -> None:
        super().__init__()
        self.lr, self.momentum, self.dampening = float(lr), float(momentum), float(dampening)
        self.nesterov, self.weight_decay = bool(nesterov), float(weight_decay)

    def __repr__(self) -> str:
        return (
            f"StackedSGD(lr={self.lr}, momentum={self.momentum}, dampening={self.dampening}, "
            f"nesterov={self.nesterov}, weight_decay={self.weight_decay})"
        )

    @classmethod
    def _from_group(cls, group: Mapping[str, Any]) -> Self:
        return cls(
            lr=group["lr"],
            momentum=group["momentum"],
            dampening=group["dampening"],
            nesterov=group["nesterov"],
            weight_decay=group["weight_decay"],
        )

    def _update(
        self, name: str, p: Tensor, g: Tensor, *, on: Tensor, everyone: bool, before: list[int], after: list[int]
    ) -> None:
        d = g if self.weight_decay == 0 else g.add(p, alpha=self.weight_decay)
        if self.momentum != 0:
            state = self.state.setdefault(name, {})
            if "momentum_buffer" not in state:
                state["momentum_buffer"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            buf = state["momentum_buffer"]
            fresh = [b == 0 and a == 1 for b, a in zip(before, after, strict=True)]  # a client's first active step
            if everyone and not any(fresh):
                buf.mul_(self.momentum).add_(d, alpha=1 - self.dampening)
            else:
                new = d if all(fresh) else buf.mul(self.momentum).add_(d, alpha=1 - self.dampening)
                if any(fresh) and not all(fresh):
                    first = torch.tensor(fresh, device=p.device).reshape(on.shape)
                    new = torch.where(first, d, new)
                buf.copy_(new if everyone else torch.where(on, new, buf))
            d = d.add(buf, alpha=self.momentum) if self.nesterov else buf
        if self.client_lr is None:
            if everyone:
                p.add_(d, alpha=-self.lr)
            else:
                p.copy_(torch.where(on, p.add(d, alpha=-self.lr), p))
            return
        # one pass per distinct rate, each client's rows updated as torch would with its own rate
        rates = self.client_lr
        for rate in sorted(set(rates)):
            rows = torch.tensor([r == rate for r in rates], device=p.device).reshape(on.shape) & on
            p.copy_(torch.where(rows, p.add(d, alpha=-rate), p))


class StackedAdam(StackedOptimizer):
    """``torch.optim.Adam`` (L2 or decoupled weight decay, no AMSGrad) of K stacked clients.

    Per client at its t-th active step: g ← g + λx (L2) or x ← x(1 − γλ) (decoupled);
    m ← m + (1 − β₁)(g − m); v ← β₂v + (1 − β₂)g²; x ← x − γ/(1 − β₁ᵗ) · m / (√v / √(1 − β₂ᵗ) + ε).
    State: ``step`` (K,), ``exp_avg`` and ``exp_avg_sq`` (K, ...).
    """

    optimizer: ClassVar[type[torch.optim.Optimizer]] = torch.optim.Adam
    keywords: ClassVar[frozenset[str]] = frozenset(
        {"lr", "betas", "eps", "weight_decay", "decoupled_weight_decay", *_MUST_BE_OFF}
    )

    def __init__(
        self,
        *,
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
        decoupled_weight_decay: bool = False,
    ) -> None:
        super().__init__()
        self.lr, self.eps, self.weight_decay = float(lr), float(eps), float(weight_decay)
        self.betas = (float(betas[0]), float(betas[1]))
        self.decoupled_weight_decay = bool(decoupled_weight_decay)

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(lr={self.lr}, betas={self.betas}, eps={self.eps}, "
            f"weight_decay={self.weight_decay}, decoupled_weight_decay={self.decoupled_weight_decay})"
        )

    @classmethod
    def _from_group(cls, group: Mapping[str, Any]) -> Self:
        return cls(
            lr=group["lr"],
            betas=group["betas"],
            eps=group["eps"],
            weight_decay=group["weight_decay"],
            decoupled_weight_decay=group["decoupled_weight_decay"],
        )

    def _scalars(self, after: list[int], like: Tensor, shape: tuple[int, ...]) -> tuple[Tensor, Tensor]:
        """Each client's −step size and √(bias correction 2), as torch computes them in Python floats."""
        key = ("adam", tuple(after), like.dtype, like.device)  # (the rates are fixed for the optimiser's life)
        if key not in self._cache:
            beta1, beta2 = self.betas
            neg_step, bc2_sqrt = [], []
            for count, lr in zip(after, self._client_lrs(len(after)), strict=True):
                step = float(max(count, 1))  # (an inactive client's values are masked out)
                neg_step.append(-(lr / (1 - beta1**step)))
                bc2_sqrt.append((1 - beta2**step) ** 0.5)
            self._cache[key] = torch.tensor([neg_step, bc2_sqrt], dtype=like.dtype).to(like.device, non_blocking=True)
        values = self._cache[key]
        return values[0].reshape(shape), values[1].reshape(shape)

    def _update(
        self, name: str, p: Tensor, g: Tensor, *, on: Tensor, everyone: bool, before: list[int], after: list[int]
    ) -> None:
        beta1, beta2 = self.betas
        state = self.state.setdefault(name, {})
        if not state:
            state["step"] = torch.zeros(p.shape[0], dtype=torch.get_default_dtype(), device=p.device)
            state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
        step, exp_avg, exp_avg_sq = state["step"], state["exp_avg"], state["exp_avg_sq"]
        step.add_(on.reshape(-1).to(step.dtype))
        neg_step, bc2_sqrt = self._scalars(after, p, tuple(on.shape))
        x = p
        if self.weight_decay != 0:
            if self.decoupled_weight_decay and self.client_lr is None:
                x = p.mul(1 - self.lr * self.weight_decay)
            elif self.decoupled_weight_decay:  # each client's own 1 − γλ, as a Python float
                decay = [1 - lr * self.weight_decay for lr in self._client_lrs(p.shape[0])]
                x = p.mul(torch.tensor(decay, dtype=p.dtype, device=p.device).reshape(on.shape))
            else:
                g = g.add(p, alpha=self.weight_decay)
        if everyone:
            exp_avg.lerp_(g, 1 - beta1)
            exp_avg_sq.mul_(beta2).addcmul_(g, g, value=1 - beta2)
            m, v = exp_avg, exp_avg_sq
        else:
            m = exp_avg.lerp(g, 1 - beta1)
            v = exp_avg_sq.mul(beta2).addcmul_(g, g, value=1 - beta2)
        denom = (v.sqrt() / bc2_sqrt).add_(self.eps)
        # param.addcdiv_(m, denom, value=-step_size) computes x + (value·m)/denom: the same roundings
        update = m.mul(neg_step).div_(denom)
        if everyone:
            if x is not p:
                p.copy_(x)
            p.add_(update)
        else:
            exp_avg.copy_(torch.where(on, m, exp_avg))
            exp_avg_sq.copy_(torch.where(on, v, exp_avg_sq))
            p.copy_(torch.where(on, x.add(update), p))


class StackedAdamW(StackedAdam):
    """``torch.optim.AdamW`` of K stacked clients: :class:`StackedAdam` with decoupled weight decay."""

    optimizer = torch.optim.AdamW
    keywords = frozenset({"lr", "betas", "eps", "weight_decay", *_MUST_BE_OFF})

    def __init__(
        self,
        *,
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 1e-2,
    ) -> None:
        super().__init__(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, decoupled_weight_decay=True)

    @classmethod
    def _from_group(cls, group: Mapping[str, Any]) -> Self:
        return cls(lr=group["lr"], betas=group["betas"], eps=group["eps"], weight_decay=group["weight_decay"])


_CLASSES: tuple[type[StackedOptimizer], ...] = (StackedSGD, StackedAdam, StackedAdamW)


def stacked_optimizer(factory: Callable[..., torch.optim.Optimizer]) -> StackedOptimizer | None:
    """The stacked optimiser serving the client-optimiser ``factory``, else ``None``.

    >>> stacked_optimizer(functools.partial(torch.optim.AdamW, lr=0.01))
    StackedAdamW(lr=0.01, betas=(0.9, 0.999), eps=1e-08, weight_decay=0.01, decoupled_weight_decay=True)
    >>> stacked_optimizer(functools.partial(torch.optim.Adam, amsgrad=True)) is None
    True
    """
    for cls in _CLASSES:
        found = cls.from_factory(factory)
        if found is not None:
            return found
    return None


def refusal(factory: Callable[..., torch.optim.Optimizer]) -> str:
    """One sentence on why :func:`stacked_optimizer` refuses ``factory``; ``""`` where it is served.

    >>> refusal(functools.partial(torch.optim.Adam, amsgrad=True))
    'method.client_optimizer torch.optim.Adam(amsgrad=True) turns on amsgrad, which StackedAdam does not implement.'
    """
    if not isinstance(factory, functools.partial):
        return f"{_KEY} must be a functools.partial (Hydra `_partial_: true`) of a torch optimiser, not {factory!r}."
    for cls in _CLASSES:
        if factory.func is cls.optimizer:
            return cls.refusal(factory)
    served = ", ".join(f"torch.optim.{c.optimizer.__name__}" for c in _CLASSES)
    return f"{_KEY} is {_describe(factory)}; the stacked clients serve only {served}."


def _describe(factory: functools.partial[Any]) -> str:
    func = factory.func
    if isinstance(func, type):
        module = "torch.optim" if func.__module__.startswith("torch.optim.") else func.__module__
        name = f"{module}.{func.__qualname__}"
    else:
        name = repr(func)
    args = [repr(a) for a in factory.args] + [f"{k}={v!r}" for k, v in factory.keywords.items()]
    return f"{name}({', '.join(args)})"


def _has_tensor(value: Any) -> bool:
    if isinstance(value, Tensor):
        return True
    return isinstance(value, tuple | list) and any(isinstance(v, Tensor) for v in value)
