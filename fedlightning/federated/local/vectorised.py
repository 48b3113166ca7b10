"""The ``vectorised`` backend: every client of a share trained at once on stacked parameters.

FedAvg's local work (McMahan et al., arXiv 1602.05629) is the same small program on each
client: steps of a client optimiser from the broadcast. Here the K clients' parameters are
stacked along a leading client axis and one step of all K clients is one ``torch.func.vmap``
of ``torch.func.functional_call`` over (parameters, batch), one backward pass, and one update
of the stacked optimiser state (:mod:`fedlightning.federated.local.stacked_optim`). Unequal
clients are padded:

* batches are padded to the batch size with a sample mask (a short last batch counts only its
  own samples, its loss is the mean over them, as in the sequential loop);
* clients with fewer steps are padded with inactive steps, which leave a client's parameters
  and optimiser state exactly as they were, so each client takes exactly its own steps.

The batch schedules are the sequential path's own (each client's ``batches`` stream), so both
paths see the same batches and agree within float rounding. Served: the engine's default
``client_update`` / ``local_train`` / ``local_loss`` with ``torch.optim.SGD`` (momentum,
dampening, Nesterov, weight decay), ``torch.optim.Adam`` or ``torch.optim.AdamW``,
cross-entropy or squared error, ``max_grad_norm``, models without buffers (GroupNorm is fine),
step budgets of failure injection (stragglers). It is the accelerator path: on a CPU the
sequential backends are as fast.

>>> plan = plan_steps([[torch.tensor([1, 0]), torch.tensor([2])], [torch.tensor([0])]], [0, 3], 2)
>>> plan.index.tolist(), plan.mask.int().tolist(), plan.steps.tolist()
([[[1, 0], [2, 0]], [[3, 0], [0, 0]]], [[[1, 1], [1, 0]], [[1, 0], [0, 0]]], [2, 1])
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, cast

import torch
from torch import Tensor, nn

from fedlightning.errors import ConfigError
from fedlightning.federated.batches import Schedule
from fedlightning.federated.local.base import (
    ClientResult,
    ClientRunner,
    ResultRows,
    ShareResults,
    engine_base,
    overrides,
    own_local_work,
)
from fedlightning.federated.local.stacked_optim import StackedOptimizer, refusal, stacked_optimizer
from fedlightning.federated.params import unflatten_like

if TYPE_CHECKING:
    from fedlightning.federated.module import FederatedModule

__all__ = [
    "ShareData",
    "StackedLocalWork",
    "StepPlan",
    "VectorisedRunner",
    "client_rates",
    "per_sample_loss",
    "plan_steps",
    "randomness_refusal",
    "share_data",
    "stacked_work_owner",
    "train_stacked",
]


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


def plan_steps(schedules: Sequence[Sequence[Tensor] | Schedule], offsets: Sequence[int], batch_size: int) -> StepPlan:
    """Pad K clients' batch schedules into one :class:`StepPlan` (``offsets``: where each client's data starts).

    Built with tensor operations over the share's concatenated indices (no loop over steps).
    """
    plans = [s if isinstance(s, Schedule) else Schedule.of(s) for s in schedules]
    k = len(plans)
    steps = torch.tensor([p.steps for p in plans], dtype=torch.long)
    s = int(steps.max()) if k else 0
    index = torch.zeros(k, s, batch_size, dtype=torch.long)
    mask = torch.zeros(k, s, batch_size, dtype=torch.bool)
    if k and s:
        # every batch of the share, client by client
        sizes = torch.tensor([b for p in plans for b in p.batch_sizes], dtype=torch.long)
        lengths = torch.tensor([sum(p.batch_sizes) for p in plans], dtype=torch.long)
        flat = torch.cat([p.index for p in plans]) + torch.repeat_interleave(torch.tensor(offsets), lengths)
        client = torch.repeat_interleave(torch.arange(k), steps)
        first_batch = torch.cumsum(steps, 0) - steps
        step = torch.arange(len(sizes)) - torch.repeat_interleave(first_batch, steps)
        batch = torch.repeat_interleave(torch.arange(len(sizes)), sizes)
        first_index = torch.cumsum(sizes, 0) - sizes
        position = torch.arange(len(flat)) - torch.repeat_interleave(first_index, sizes)
        index[client[batch], step[batch], position] = flat
        mask[client[batch], step[batch], position] = True
    active = mask.any(dim=2)
    return StepPlan(index=index, mask=mask, active=active, steps=active.sum(dim=1))


def per_sample_loss(task: str) -> Callable[[Tensor, Tensor], Tensor]:
    """The engine's loss of the task, per sample (cross-entropy, or squared error on (B,) targets)."""
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
    optimizer: StackedOptimizer,
    task: str,
    max_grad_norm: float | None,
    penalty: Callable[[Mapping[str, Tensor], Mapping[str, Tensor]], Tensor | None] | None = None,
    transform: Callable[[Tensor], Tensor] | None = None,
) -> tuple[dict[str, Tensor], Tensor, Tensor]:
    """Local SGD of K clients at once from the same ``start`` parameters.

    Args:
        model: the architecture (its own parameters are not used or changed).
        start: parameter name -> tensor, the received model.
        x, y: the concatenated data of the K clients (``plan.index`` points into them).
        plan: the padded schedule.
        optimizer: the client optimiser, stacked (fresh: no client has stepped yet).
        task: ``classification`` (cross-entropy) or ``regression`` (squared error).
        max_grad_norm: per-client clipping of each step's gradient (as ``clip_grad_norm_``).
        penalty: a term of (a client's parameters, ``start``) added to every client's batch loss
            (the method's ``local_penalty``, e.g. FedProx's proximal term).
        transform: applied to each gathered batch of ``x`` (the datamodule's elementwise
            ``transform``, e.g. ``uint8`` pixels to normalised floats).

    Returns:
        The final stacked parameters (name -> (K, ...)), each client's first-step loss (K,)
        and each client's mean loss over its steps (K,).
    """
    k, steps, _ = plan.index.shape
    names = list(start)
    params = {n: start[n].detach().unsqueeze(0).expand(k, *start[n].shape).clone() for n in names}
    loss_fn = per_sample_loss(task)
    device = x.device
    index, mask, active = (
        plan.index.to(device),
        plan.mask.to(device),
        plan.active.to(device),
    )  # (plan's stay on the host)
    counts = mask.sum(dim=2).clamp(min=1).to(x.dtype if x.is_floating_point() else torch.float32)

    def client_loss(p: dict[str, Tensor], xb: Tensor, yb: Tensor, mb: Tensor, count: Tensor) -> Tensor:
        out = torch.func.functional_call(model, p, (xb,))
        per = loss_fn(out, yb)
        loss = (per * mb).sum() / count
        extra = penalty(p, start) if penalty is not None else None
        return loss if extra is None else loss + extra

    batched = torch.func.vmap(client_loss)
    loss_sum = torch.zeros(k, device=device)
    first_loss = torch.zeros(k, device=device)
    for n in names:
        params[n].requires_grad_(True)  # leaves of every step's graph, updated in place between steps
    for s in range(steps):
        idx = index[:, s]
        xb, yb = x[idx], y[idx]
        if transform is not None:
            xb = transform(xb)
        mb = mask[:, s].to(counts.dtype)
        losses = batched(params, xb, yb, mb, counts[:, s])
        grads = torch.autograd.grad(losses.sum(), [params[n] for n in names])
        on = active[:, s]
        with torch.no_grad():
            if max_grad_norm is not None:
                norms = torch.sqrt(sum(g.reshape(k, -1).pow(2).sum(dim=1) for g in grads))  # type: ignore[arg-type]
                coef = (max_grad_norm / (norms + 1e-6)).clamp(max=1.0)
                grads = tuple(g * coef.reshape((-1,) + (1,) * (g.dim() - 1)) for g in grads)
            optimizer.step_(params, dict(zip(names, grads, strict=True)), plan.active[:, s])
            step_loss = torch.where(on, losses.detach(), torch.zeros_like(losses))
            loss_sum += step_loss
            if s == 0:
                first_loss = step_loss.clone()
    mean_loss = loss_sum / plan.steps.to(device).clamp(min=1).to(loss_sum.dtype)
    return {n: params[n].detach() for n in names}, first_loss, mean_loss


class StackedLocalWork(Protocol):
    """A method's own local work for a whole share at once, which the vectorised backend runs.

    The method defines both hooks; the backend serves it (and its subclasses that override none
    of its local-work hooks) where :meth:`stacked_refusal` says nothing. Its results must equal
    its ``client_update`` on each client within float rounding, in ``share`` order. A method with
    ``per_client_downlink`` also receives ``received_by_client``, each client's decoded message.
    """

    def stacked_refusal(self) -> str | None:
        """Why this run's clients cannot be trained at once by :meth:`stacked_client_updates` (``None``: they can)."""
        ...

    def stacked_client_updates(self, *, round_idx: int, share: list[int], received: Tensor) -> list[ClientResult]:
        """Each client of ``share``'s result from the decoded broadcast ``received``."""
        ...


def stacked_work_owner(cls: type) -> type | None:
    """The nearest class of ``cls`` that defines :class:`StackedLocalWork`'s hooks, else ``None``."""
    for c in cls.__mro__:
        if "stacked_client_updates" in vars(c):
            return c
    return None


@dataclass(frozen=True)
class ShareData:
    """A share's data as the loop would train it: each client's samples and its own batch schedule.

    Attributes:
        schedules: each client's batches from its own stream, cut to its step budget.
        offsets: where each client's samples start in the tensors of :meth:`gathered`.
        num_samples: each client's number of samples.
        source: every client's data where the module keeps it (``resident_train_data``), which
            :attr:`offsets` point into; ``None`` when each client's tensors were fetched apart
            (:attr:`parts`), whose concatenation the offsets then point into.
        parts: each client's features and targets, fetched apart (``None`` with a source).
    """

    schedules: list[Schedule]
    offsets: list[int]
    num_samples: list[int]
    source: tuple[Tensor, Tensor] | None = None
    parts: tuple[list[Tensor], list[Tensor]] | None = None

    @property
    def x(self) -> list[Tensor]:
        """Each client's features, in share order (on the module's device)."""
        return self._client_tensors(0)

    @property
    def y(self) -> list[Tensor]:
        """Each client's targets, in share order (on the module's device)."""
        return self._client_tensors(1)

    def _client_tensors(self, which: int) -> list[Tensor]:
        if self.parts is not None:
            return self.parts[which]
        assert self.source is not None
        data = self.source[which]
        return [data[o : o + n] for o, n in zip(self.offsets, self.num_samples, strict=True)]

    def plan(self, batch_size: int) -> StepPlan:
        """The padded plan of the share (:func:`plan_steps`)."""
        return plan_steps(self.schedules, self.offsets, batch_size)

    def gathered(self) -> tuple[Tensor, Tensor]:
        """The tensors :attr:`offsets` point into: every client's data where kept, else the share's, concatenated."""
        if self.source is not None:
            return self.source
        return torch.cat(self.x), torch.cat(self.y)


def share_data(module: FederatedModule, *, share: list[int], round_idx: int, resident: bool = False) -> ShareData:
    """Each client's data and batches, drawn exactly as the loop draws them (budgets of stragglers included).

    With ``resident``, where the module keeps every client's data (the engine's
    ``resident_train_data``), the offsets point into them (:attr:`ShareData.source`) and no
    client's tensors are fetched or copied; otherwise into the share's data, concatenated.
    """
    source = module.resident_train_data() if resident else None
    spans = [module.datamodule.client_span(c) for c in share] if source is not None else []
    parts: tuple[list[Tensor], list[Tensor]] | None = None
    if source is not None and all(span is not None for span in spans):
        offsets = [span[0] for span in spans if span is not None]
        sizes = [span[1] - span[0] for span in spans if span is not None]
    else:
        source, xs, ys = None, [], []
        for client_id in share:
            x, y = module.client_data(client_id)
            xs.append(x)
            ys.append(y)
        parts = (xs, ys)
        sizes = [len(y) for y in ys]
        offsets = [0, *itertools.accumulate(sizes)][:-1]
    schedules = []
    for client_id, n in zip(share, sizes, strict=True):
        schedule = module.client_schedule(client_id=client_id, round_idx=round_idx, num_samples=n)
        if module.cuts_local_steps:  # e.g. stragglers: at most a budget of the planned steps
            budget = module.local_step_budget(client_id=client_id, round_idx=round_idx, planned=schedule.steps)
            schedule = schedule.cut(budget)
        schedules.append(schedule)
    return ShareData(schedules=schedules, offsets=offsets, num_samples=sizes, source=source, parts=parts)


def randomness_refusal(module: FederatedModule) -> str | None:
    """Why the stacked clients would not draw what the loop draws: data that augments, or dropout layers."""
    dm = type(module.datamodule)
    if len([c for c in dm.__mro__ if "augment" in vars(c)]) > 1:  # its own augment overrides the base's identity
        return f"data: {dm.__name__} augments each batch randomly, which the stacked clients do not reproduce"
    dropout = [type(m).__name__ for m in module.client_model.modules() if isinstance(m, nn.modules.dropout._DropoutNd)]
    if dropout:
        return f"model: its {dropout[0]} layers draw from the global random stream, unlike the stacked clients"
    return None


def client_rates(module: FederatedModule, *, share: list[int], round_idx: int) -> list[float]:
    """Each client's learning rate, read from the method's own ``make_client_optimizer``.

    A method may give each client its own step size (e.g. FedShuffle's, scaled to the client's
    local epochs); anything else that differs from the round's client optimiser (another class,
    other settings, more than one parameter group, state carried over from earlier rounds)
    cannot be stacked and stops the run in one sentence.
    """
    probe = [nn.Parameter(torch.zeros(1))]
    reference = module.round_client_optimizer(probe)
    want = {k: v for k, v in reference.param_groups[0].items() if k not in ("params", "lr", "initial_lr")}
    rates = []
    for client_id in share:
        own = module.make_client_optimizer(probe, client_id=client_id, round_idx=round_idx)
        groups = own.param_groups
        same = type(own) is type(reference) and len(groups) == 1 and not own.state
        if not same or {k: v for k, v in groups[0].items() if k not in ("params", "lr", "initial_lr")} != want:
            raise ConfigError(
                f"local_execution=vectorised cannot run {type(module).__name__}'s clients: its make_client_optimizer "
                f"gives client {client_id} an optimiser that differs from method.client_optimizer in more than its "
                "learning rate; set local_execution=loop."
            )
        rates.append(float(groups[0]["lr"]))
    return rates


class VectorisedRunner(ClientRunner):
    """``vectorised``: the share's clients at once (:func:`train_stacked`), the same results as the loop."""

    name = "vectorised"

    def refusal(self, module: FederatedModule) -> str | None:
        owner = stacked_work_owner(type(module))
        if owner is not None:  # the method's own stacked local work, for the local work of its class
            hooks = (*module.local_work_hooks, "make_client_optimizer", "client_batches", "client_downlink")
            own = own_local_work(type(module), owner, hooks, f"{owner.__name__}'s stacked local work")
            return own or cast(StackedLocalWork, module).stacked_refusal()
        if module.per_client_downlink:
            return "each client receives its own message (per_client_downlink)"
        hooks = module.local_work_hooks  # (its own client_batches are followed; make_client_optimizer: client_rates)
        own = own_local_work(type(module), engine_base(type(module)), hooks, "the engine's local SGD")
        if own:
            return own
        why = randomness_refusal(module)
        if why:
            return why
        why = refusal(module.round_client_optimizer)
        return why.rstrip(".") or None

    def train_share(
        self,
        module: FederatedModule,
        *,
        round_idx: int,
        share: list[int],
        receive: Callable[[int], Tensor],
        receive_share: Callable[[list[int]], list[Tensor]],
    ) -> ShareResults:
        received = receive_share(share)  # every downlink is observed (and counted), in one call
        if not share:
            return []
        start_vector = received[-1]  # the broadcast, unless each client receives its own message
        if stacked_work_owner(type(module)) is not None:
            work = cast(StackedLocalWork, module)
            own: dict[str, Any] = {"received_by_client": received} if module.per_client_downlink else {}
            results = work.stacked_client_updates(round_idx=round_idx, share=share, received=start_vector, **own)
            return list(zip(share, results, strict=True))
        model = module.client_model
        named = dict(model.named_parameters())
        start = dict(zip(named, unflatten_like(start_vector, named.values()), strict=True))
        data = share_data(module, share=share, round_idx=round_idx, resident=True)
        x_all, y_all = data.gathered()
        optimizer = stacked_optimizer(module.round_client_optimizer)
        assert optimizer is not None, "refusal() was not asked"
        base = engine_base(type(module))
        if overrides(type(module), base, "make_client_optimizer"):
            optimizer.set_client_lr(client_rates(module, share=share, round_idx=round_idx))
        final, first_loss, mean_loss = train_stacked(
            model=model,
            start=start,
            x=x_all,
            y=y_all,
            transform=getattr(module.datamodule, "transform", None),
            plan=data.plan(module.batch_size),
            optimizer=optimizer,
            task=module.task,
            max_grad_norm=module.max_grad_norm,
            penalty=module.local_penalty if overrides(type(module), base, "local_penalty") else None,
        )
        uploads = torch.cat([final[n].reshape(len(share), -1) for n in named], dim=1) - start_vector
        took = torch.tensor([b.steps > 0 for b in data.schedules], device=first_loss.device)
        module.record_start_losses(first_loss[took])  # the received model's loss on each client's first batch
        return ResultRows(client_ids=share, uploads=uploads, num_samples=data.num_samples, losses=mean_loss)
