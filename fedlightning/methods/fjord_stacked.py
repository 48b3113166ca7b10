"""FjORD's clients trained at once on stacked parameters: one vmapped pass per sub-model in use and step.

FjORD (Horváth et al., arXiv 2102.13451, Algorithm 10; FjORD + eFD, Algorithm 11) trains, at every
local step of client i, the ordered-dropout sub-model F_p of a width p drawn from the client's own
``fjord_width`` stream (:meth:`~fedlightning.methods.fjord.FjORD.step_loss`), with
self-distillation (7.1) from its largest ordered width s_i. :func:`stacked_client_updates` is the
method's :class:`~fedlightning.federated.local.vectorised.StackedLocalWork` for the ``vectorised``
backend: a share's K clients at once.

* **Draws.** Every client's widths, and above its tier p_max its random units, are drawn up front
  from its ``fjord_width`` stream in the order ``step_loss`` draws them step by step (one width, then
  the units where p > p_max), one step per planned batch.
* **Parameters.** The K clients' parameters are stacked on a leading client axis. Client i starts
  from the slice it received; every sub-model it runs lies in that slice (widths up to its reach,
  teacher s_i ≤ p_max), so the coordinates outside are never read and start at 0.
* **One pass per sub-model.** At each step the active clients are grouped by the unit set each
  forward needs (the student's F_p, and the teacher's F_{s_i} under distillation); each group is
  one ``torch.func.vmap`` of the ordered-dropout forward over its clients' parameters, so a width
  that is one client's student and another's teacher runs once for both. A client runs exactly
  the ops of its own sub-model, as in the loop. (A full-width pass with per-client unit masks would
  not: ResNet18-GN's GroupNorm normalises over the kept channels only, and masks would sum and
  back-propagate through every unit of every client.)
* **Step.** The loss (7.1), or cross-entropy on F_p, is formed per client, padded samples masked;
  one backward pass gives every client's gradient, then each client's own clipping
  (``max_grad_norm``) and the stacked client optimiser
  (:mod:`fedlightning.federated.local.stacked_optim`) step the active clients.

Batches (``batches`` stream, straggler budgets) and augmentation (``augment`` stream, per client
and batch) are each client's own, as in the loop, so each upload (the trained slice minus the
received one) equals :meth:`~fedlightning.methods.fjord.FjORD.client_update`'s within float
rounding: a vmapped pass batches the clients' matrix products, and the masked means sum in
another order.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fedlightning.datamodules.base import FederatedDataModule
from fedlightning.federated.local.base import ClientResult
from fedlightning.federated.local.stacked_optim import refusal as optimizer_refusal
from fedlightning.federated.local.stacked_optim import stacked_optimizer
from fedlightning.federated.local.vectorised import share_data
from fedlightning.models.ordered_dropout import (
    CharLSTMArchitecture,
    ODArchitecture,
    ResNet18GNArchitecture,
    SequentialMLPArchitecture,
    SmallCNNArchitecture,
    ordered_units,
    random_units,
)

if TYPE_CHECKING:
    from fedlightning.methods.fjord import FjORD

__all__ = ["stacked_client_updates", "stacked_refusal"]

_VMAPPED: tuple[type[ODArchitecture], ...] = (
    SequentialMLPArchitecture,
    SmallCNNArchitecture,
    ResNet18GNArchitecture,
)
"""The ordered-dropout forwards that run under ``torch.func.vmap`` (the LSTM kernel has no batching rule)."""

UnitsKey = tuple[int | tuple[int, ...], ...]


def stacked_refusal(method: FjORD) -> str | None:
    """Why :func:`stacked_client_updates` cannot train ``method``'s clients (one clause), else ``None``.

    (A subclass that chooses its own sub-models overrides one of FjORD's ``local_work_hooks``, which
    the vectorised backend refuses before asking.)
    """
    if isinstance(method.arch, CharLSTMArchitecture):
        return (
            "the ordered-dropout forward of model=char_lstm runs the LSTM kernel, which has no batching rule "
            "under torch.func.vmap"
        )
    if not isinstance(method.arch, _VMAPPED):
        return f"the ordered-dropout forward of {type(method.arch.template).__name__} (model) is not known to vmap"
    return optimizer_refusal(method.round_client_optimizer).rstrip(".") or None


@dataclass(frozen=True)
class _Draw:
    """One local step's sub-models: the student's units and the teacher's (``None``: plain CE on F_p)."""

    student: UnitsKey
    teacher: UnitsKey | None


def _key(units: list[Tensor]) -> UnitsKey:
    """A hashable name of a unit set: the count of a prefix (ordered units), else the indices."""
    return tuple(int(u.numel()) if u.numel() == 0 or int(u[-1]) == u.numel() - 1 else tuple(u.tolist()) for u in units)


def _draws(
    method: FjORD, client_id: int, round_idx: int, steps: int, units: dict[UnitsKey, list[Tensor]]
) -> list[_Draw]:
    """Client ``client_id``'s sub-models of its ``steps`` steps, drawn as :meth:`FjORD.step_loss` draws them."""
    gen = method.generator(round_idx, client_id, "fjord_width")
    candidates = method.candidates(client_id)
    teacher_p, p_max = method.teacher_width(client_id), method.tiers[method.client_tier[client_id]]
    widths = method.arch.widths()
    teacher_units = ordered_units(widths, teacher_p)
    teacher = _key(teacher_units)
    units.setdefault(teacher, teacher_units)
    draws = []
    for _ in range(steps):
        p = candidates[int(torch.randint(len(candidates), (1,), generator=gen))]
        if p > p_max + 1e-12:  # adaptive dropout: ⌈p_max·K_l⌉ random units of F_p
            chosen = random_units(widths, outer=p, inner=p_max, generator=gen)
        else:
            chosen = ordered_units(widths, p)
        student = _key(chosen)
        units.setdefault(student, chosen)
        draws.append(_Draw(student, None if not method.distillation or p == teacher_p else teacher))
    return draws


class _SubModel(nn.Module):
    """``arch.forward(net, x, units)`` as a module, whose parameters ``torch.func.functional_call`` swaps."""

    def __init__(self, net: nn.Module, arch: ODArchitecture) -> None:
        super().__init__()
        self.net = net
        self.arch = arch

    def forward(self, x: Tensor, units: list[Tensor]) -> Tensor:
        return self.arch.forward(self.net, x, units)


def _masked_mean(per_sample: Tensor, mask: Tensor, count: Tensor) -> Tensor:
    """Each row's mean over its real samples: (A, B) values, (A, B) 0/1 mask, (A,) counts."""
    return (per_sample * mask).sum(dim=1) / count


def _cross_entropy(logits: Tensor, y: Tensor) -> Tensor:
    """Per-sample cross-entropy of (A, B, C) logits and (A, B) labels."""
    return F.cross_entropy(logits.flatten(0, 1), y.flatten(), reduction="none").view(y.shape)


def stacked_client_updates(
    method: FjORD,
    *,
    round_idx: int,
    share: list[int],
    received: Tensor,
    received_by_client: list[Tensor] | None = None,
) -> list[ClientResult]:
    """Each client of ``share``'s :meth:`FjORD.client_update` result, the clients trained at once (module docstring).

    Args:
        method: the FjORD run.
        round_idx: the round.
        share: this process's clients, in order.
        received: the decoded broadcast (the full model), from which each client's slice is cut,
            used only without ``received_by_client``.
        received_by_client: each client's decoded own message (its slice), in ``share`` order,
            as the ``vectorised`` backend passes it to a method with ``per_client_downlink``.
    """
    device = method.device
    k = len(share)
    model = method.client_model
    named = dict(model.named_parameters())
    names = list(named)
    sizes = [p.numel() for p in named.values()]
    slices = [method.client_indices(cid, round_idx).to(device) for cid in share]
    if received_by_client is None:
        starts = [received.to(device)[idx] for idx in slices]
    else:
        starts = [r.to(device) for r in received_by_client]

    # each client's data, batches and sub-model draws
    data = share_data(method, share=share, round_idx=round_idx)
    xs, ys, schedules = data.x, data.y, data.schedules
    plan = data.plan(method.batch_size)
    units: dict[UnitsKey, list[Tensor]] = {}
    draws = [_draws(method, cid, round_idx, len(b), units) for cid, b in zip(share, schedules, strict=True)]
    dm = method.datamodule
    augments = type(dm).augment is not FederatedDataModule.augment
    y_all = torch.cat(ys)
    x_all = torch.cat(xs) if augments else dm.transform(torch.cat(xs))
    augment_gens = [method.generator(round_idx, cid, "augment") for cid in share] if augments else []

    # stacked parameters: each client's received slice, 0 elsewhere (never read by its sub-models)
    flat = torch.zeros(k, sum(sizes), device=device, dtype=starts[0].dtype if starts else torch.float32)
    for c, (idx, start) in enumerate(zip(slices, starts, strict=True)):
        flat[c, idx] = start.to(flat.dtype)
    params = {
        n: piece.reshape(k, *named[n].shape).clone().requires_grad_(True)
        for n, piece in zip(names, torch.split(flat, sizes, dim=1), strict=True)
    }
    optimizer = stacked_optimizer(method.round_client_optimizer)
    assert optimizer is not None, "stacked_refusal() was not asked"
    wrapper = _SubModel(model, method.arch)

    def forward(units_: list[Tensor], group: dict[str, Tensor], x_: Tensor) -> Tensor:
        return torch.func.vmap(lambda p, xb_: torch.func.functional_call(wrapper, p, (xb_, units_)))(group, x_)

    index, mask = plan.index.to(device), plan.mask.to(device)
    counts = mask.sum(dim=2).clamp(min=1).to(flat.dtype)
    loss_sum = torch.zeros(k, device=device, dtype=flat.dtype)
    first_loss = torch.zeros(k, device=device, dtype=flat.dtype)
    alpha, t = method.kd_alpha, method.kd_temperature
    active = plan.active.T.tolist()
    for s in range(plan.index.shape[1]):
        act = [c for c in range(k) if active[s][c]]
        act_t = torch.tensor(act, device=device)
        if augments:  # each client's batch through its own augment stream, as the loop does
            xb = torch.stack(
                [
                    _padded(dm.augment(xs[c][schedules[c][s].to(device)], augment_gens[c]), method.batch_size)
                    for c in act
                ]
            )
        else:
            xb = x_all[index[act_t, s]]
        yb, mb, cb = y_all[index[act_t, s]], mask[act_t, s].to(flat.dtype), counts[act_t, s]
        # one vmapped pass per unit set in use: rows of `outputs` are (position in act, role)
        needs: dict[UnitsKey, list[tuple[int, int]]] = defaultdict(list)
        for a, c in enumerate(act):
            draw = draws[c][s]
            needs[draw.student].append((a, 0))
            if draw.teacher is not None:
                needs[draw.teacher].append((a, 1))
        outputs: list[Tensor] = []
        row: dict[tuple[int, int], int] = {}
        for key, members in needs.items():
            positions = [a for a, _ in members]  # (a client twice where its student's units are its teacher's)
            whole = len(act) == k and positions == list(range(k))
            rows = torch.tensor(positions, device=device)
            group = {f"net.{n}": params[n] if whole else params[n].index_select(0, act_t[rows]) for n in names}
            outputs.append(forward(units[key], group, xb if whole else xb.index_select(0, rows)))
            for member in members:
                row[member] = len(row)
        logits = torch.cat(outputs)
        student = logits[torch.tensor([row[(a, 0)] for a in range(len(act))], device=device)]
        loss = _masked_mean(_cross_entropy(student, yb), mb, cb)
        distil = [a for a, c in enumerate(act) if draws[c][s].teacher is not None]
        if distil:
            d = torch.tensor(distil, device=device)
            teacher = logits[torch.tensor([row[(a, 1)] for a in distil], device=device)]
            kd = F.kl_div(
                F.log_softmax(student[d] / t, dim=2),
                F.log_softmax(teacher.detach() / t, dim=2),
                reduction="none",
                log_target=True,
            ).sum(dim=2)
            kd = _masked_mean(kd, mb[d], cb[d])
            student_ce = loss[d] if alpha < 1 else torch.zeros_like(kd)
            teacher_ce = _masked_mean(_cross_entropy(teacher, yb[d]), mb[d], cb[d])
            loss = loss.index_put((d,), teacher_ce + (1 - alpha) * student_ce + alpha * t * t * kd)
        grads = torch.autograd.grad(loss.sum(), [params[n] for n in names], allow_unused=True)
        with torch.no_grad():
            full = [torch.zeros_like(params[n]) if g is None else g for n, g in zip(names, grads, strict=True)]
            if method.max_grad_norm is not None:
                norms = torch.sqrt(sum(g.reshape(k, -1).pow(2).sum(dim=1) for g in full))  # type: ignore[arg-type]
                coef = (method.max_grad_norm / (norms + 1e-6)).clamp(max=1.0)
                full = [g * coef.reshape((-1,) + (1,) * (g.dim() - 1)) for g in full]
            optimizer.step_(params, dict(zip(names, full, strict=True)), plan.active[:, s])
            loss_sum.index_add_(0, act_t, loss.detach())
            if s == 0:
                first_loss.index_copy_(0, act_t, loss.detach())
    took = plan.steps.to(device) > 0
    method.record_start_losses(first_loss[took])  # the received slice's loss on each client's first batch
    mean_loss = loss_sum / plan.steps.to(device).clamp(min=1).to(loss_sum.dtype)
    trained = torch.cat([params[n].detach().reshape(k, -1) for n in names], dim=1)
    return [
        ClientResult(upload=trained[c, slices[c]] - starts[c], num_samples=len(ys[c]), loss=mean_loss[c])
        for c in range(k)
    ]


def _padded(x: Tensor, batch_size: int) -> Tensor:
    """``x`` (b, ...) padded with zeros to ``batch_size`` rows (masked out of the loss)."""
    if len(x) == batch_size:
        return x
    return torch.cat([x, x.new_zeros(batch_size - len(x), *x.shape[1:])])
