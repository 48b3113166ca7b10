"""The FedOpt server optimisers as ``torch.optim.Optimizer`` subclasses.

The server treats the negated aggregate update as a gradient, ``g = −Δ``, so any torch
optimiser can be a server optimiser: ``SGD(lr=1)`` is FedAvg and ``SGD(lr=1, momentum=β)``
is FedAvgM. FedAdam, FedYogi and FedAdagrad follow Reddi et al. (arXiv 2003.00295,
Algorithm 2): no bias correction, adaptivity ``τ``, and ``v_{-1} = τ²``. Methods that set their
server state have no server optimiser: their Lightning optimiser is :class:`RoundClock`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Literal

import torch
from torch import Tensor

from fedlightning.federated import aggregation

Variant = Literal["adam", "yogi", "adagrad"]


class FedOpt(torch.optim.Optimizer):
    """Adaptive server optimiser of Reddi et al. 2021 (FedAdam / FedYogi / FedAdagrad)."""

    def __init__(
        self,
        params: Iterable[Tensor],
        *,
        variant: Variant,
        lr: float = 1e-2,
        betas: tuple[float, float] = (0.9, 0.99),
        tau: float = 1e-3,
    ) -> None:
        if variant not in ("adam", "yogi", "adagrad"):
            raise ValueError(f"method.server_optimizer.variant must be adam, yogi or adagrad (got {variant!r}).")
        if lr <= 0 or tau <= 0:
            raise ValueError(f"FedOpt needs lr > 0 and tau > 0 (got lr={lr}, tau={tau}).")
        super().__init__(params, {"lr": lr, "betas": tuple(betas), "tau": tau, "variant": variant})

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:  # type: ignore[override]
        loss = closure() if closure is not None else None
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                delta = -p.grad
                state = self.state[p]
                if not state:
                    state["m"] = torch.zeros_like(p)
                    state["v"] = torch.full_like(p, group["tau"] ** 2)
                state["m"] = aggregation.fedopt_first_moment(state["m"], delta, beta1)
                v = state["v"]
                if group["variant"] == "adagrad":
                    state["v"] = aggregation.fedadagrad_second_moment(v, delta)
                elif group["variant"] == "adam":
                    state["v"] = aggregation.fedadam_second_moment(v, delta, beta2)
                else:
                    state["v"] = aggregation.fedyogi_second_moment(v, delta, beta2)
                p.copy_(aggregation.fedopt_step(p, state["m"], state["v"], group["lr"], group["tau"]))
        return loss


def FedAdam(params: Iterable[Tensor], **kwargs: float) -> FedOpt:  # noqa: N802 - named as in the paper
    """FedAdam (Reddi et al. 2021)."""
    return FedOpt(params, variant="adam", **kwargs)  # type: ignore[arg-type]


def FedYogi(params: Iterable[Tensor], **kwargs: float) -> FedOpt:  # noqa: N802
    """FedYogi (Reddi et al. 2021)."""
    return FedOpt(params, variant="yogi", **kwargs)  # type: ignore[arg-type]


def FedAdagrad(params: Iterable[Tensor], **kwargs: float) -> FedOpt:  # noqa: N802
    """FedAdagrad (Reddi et al. 2021)."""
    return FedOpt(params, variant="adagrad", **kwargs)  # type: ignore[arg-type]


class RoundClock(torch.optim.Optimizer):
    """The Lightning optimiser of methods that set their server state: a step only counts the round."""

    def __init__(self, params: Iterable[Tensor]) -> None:
        super().__init__(params, {})

    def step(self, closure: Callable[[], float] | None = None) -> float | None:  # type: ignore[override]
        return closure() if closure is not None else None
