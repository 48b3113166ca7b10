"""FjORD and extended Federated Dropout: one nested model for devices of different capacity.

Papers: Horváth, Laskaridis, Almeida, Leontiadis, Venieris, Lane, "FjORD: Fair and Accurate
Federated Learning under heterogeneous targets with Ordered Dropout", NeurIPS 2021,
arXiv 2102.13451 (thesis arXiv 2207.00392, ch. 7, Algorithm 10); Federated Dropout: Caldas et
al., arXiv 1812.07210.

**Device tiers.** Client i belongs to a tier c of capacity p_max^c (``tiers``, default one tier
per width). Tier fractions follow the drop scale ds (:func:`tier_fractions`): each non-top tier
holds ds/k of the clients and the top tier the rest (ds = 1: uniform; ds = 0.5, k = 5:
0.1, 0.1, 0.1, 0.1, 0.6). Clients are assigned once, from the run seed's server stream
(:func:`assign_tiers`), so every process and every resume sees the same tiers.

**FjORD (Algorithm 10).** Client i receives only the slice F_{s_i} of the global weights,
s_i = max{p ∈ 𝒫 : p ≤ p_max^i}; at every local step it samples p uniformly from
{p ∈ 𝒫 : p ≤ p_max^i} (its own stream) and takes an SGD step on the ordered-dropout sub-model
F_p (:mod:`fedlightning.models.ordered_dropout`). With self-distillation (7.1) the step loss is
CE(F_{s_i}(x), y) + (1 − α)·CE(F_p(x), y) + α·T²·KL(softmax(F_{s_i}(x)/T) ‖ softmax(F_p(x)/T))
with the teacher's logits detached in the KL term (the teacher's own loss is back-propagated
too); at p = s_i the step is plain CE. The client uploads the delta of its slice only; the
server averages every coordinate over the uploaders whose slice holds it, weights ∝ data size
(7.2), and coordinates nobody sent keep their value (:class:`SliceWeightedMean`). Validation
and test report accuracy at every width (``val/acc@0.2`` …); ``val/acc`` is the largest width.

**FjORD + eFD** (``adaptive_dropout: d``, Algorithm 11): a client may also sample widths
p ≤ min(p_max^i/(1 − d), 1); for p > p_max^i each droppable layer keeps ⌈p_max^i·K_l⌉ units
drawn at random from F_p's ⌈p·K_l⌉. Such a client receives and sends the slice of the largest
width it can sample. With the thesis' d = 0.25 and uniform-5 tiers, tiers 0.6 and 0.8 reach
0.8 and 1.0; tiers 0.2 and 0.4 reach no larger width of 𝒫.

**eFD** (:class:`ExtendedFederatedDropout`, the thesis' baseline): one model of width p
(``width``) is trained end to end; a client with p_max^i ≥ p trains all of F_p, a weaker client
trains a Federated-Dropout sub-model: every droppable layer keeps ⌈p_max^i·K_l⌉ of F_p's
⌈p·K_l⌉ units, drawn per round by the server (server stream of the round and client), and it
receives and sends exactly that sub-model. One run per target width gives the eFD curve.

Communication is the sub-model in both directions: 32 bits per coordinate of the slice with
the own codec (``comm/uplink_bits_per_param`` still divides by the full model's size).

``local_execution=vectorised`` trains a process's clients at once on stacked parameters, one
vmapped pass per sub-model in use (:mod:`fedlightning.methods.fjord_stacked`).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from typing import Any, ClassVar, Literal, cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torchmetrics import Metric
from torchmetrics.classification import MulticlassAccuracy
from typing_extensions import override

from fedlightning.compression.codecs import Float32Codec
from fedlightning.errors import ConfigError
from fedlightning.federated.aggregators import Aggregator
from fedlightning.federated.channel import Channel
from fedlightning.federated.module import ClientResult, FederatedModule
from fedlightning.federated.params import assign_flat_, flat_parameters, num_parameters
from fedlightning.federated.rng import SERVER, torch_generator
from fedlightning.methods import fjord_stacked
from fedlightning.models.ordered_dropout import (
    ODArchitecture,
    od_architecture,
    ordered_units,
    random_units,
    sub_model_indices,
)

__all__ = [
    "ExtendedFederatedDropout",
    "FjORD",
    "SliceChannel",
    "SliceWeightedMean",
    "assign_tiers",
    "tier_fractions",
    "uniform_widths",
    "width_name",
]

StepLoss = Callable[[Tensor, Tensor], Tensor]


# ---------------------------------------------------------------------------------- pure maths
def uniform_widths(k: int) -> list[float]:
    """𝒰_k's support {i/k}, i = 1..k.

    >>> uniform_widths(5)
    [0.2, 0.4, 0.6, 0.8, 1.0]
    """
    return [round(i / k, 12) for i in range(1, k + 1)]


def width_name(p: float) -> str:
    """The metric suffix of a width: ``0.2``, ``1.0``.

    >>> width_name(0.2), width_name(1), width_name(0.25)
    ('0.2', '1.0', '0.25')
    """
    return str(round(float(p), 6))


def tier_fractions(k: int, drop_scale: float) -> list[float]:
    """Client fractions of k tiers (lowest first): ds/k for each non-top tier, the rest for the top one.

    >>> tier_fractions(5, 1.0)
    [0.2, 0.2, 0.2, 0.2, 0.2]
    >>> tier_fractions(5, 0.5)
    [0.1, 0.1, 0.1, 0.1, 0.6]
    """
    if k < 1:
        raise ValueError(f"FjORD needs at least one device tier (got {k}).")
    top = 1.0 - (k - 1) * drop_scale / k
    if drop_scale <= 0 or top < -1e-12:
        raise ValueError(
            f"method.drop_scale={drop_scale} gives tier fractions outside [0, 1]; choose 0 < ds ≤ {k}/{k - 1}."
            if k > 1
            else f"method.drop_scale must be positive (got {drop_scale})."
        )
    return [round(drop_scale / k, 12)] * (k - 1) + [round(max(top, 0.0), 12)]


def assign_tiers(num_clients: int, fractions: Sequence[float], generator: torch.Generator) -> list[int]:
    """The tier of every client: exact counts (largest remainder of fraction × N), shuffled clients.

    >>> assign_tiers(10, [0.1, 0.1, 0.1, 0.1, 0.6], torch.Generator().manual_seed(0)).count(4)
    6
    """
    raw = [f * num_clients for f in fractions]
    counts = [math.floor(r + 1e-9) for r in raw]
    by_remainder = sorted(range(len(raw)), key=lambda t: (-(raw[t] - counts[t]), -t))
    for t in by_remainder[: num_clients - sum(counts)]:
        counts[t] += 1
    order = torch.randperm(num_clients, generator=generator).tolist()
    tiers = [0] * num_clients
    start = 0
    for tier, count in enumerate(counts):
        for client in order[start : start + count]:
            tiers[client] = tier
        start += count
    return tiers


# ---------------------------------------------------------------------------------- the server side
class SliceWeightedMean(Aggregator):
    """Slice-wise weighted average (7.2): Σ_i c_i x_i and Σ_i c_i per coordinate, over the uploads holding it.

    Every upload is the values of one index set of a ``dim``-vector; :meth:`expect` names that
    set just before the upload is accumulated. Sums are fixed-size float64 (2·dim entries).

    >>> agg = SliceWeightedMean(dim=3)
    >>> agg.expect(torch.tensor([0, 1]))
    >>> agg.accumulate(torch.tensor([1.0, 2.0]), weight=1.0)
    >>> agg.expect(torch.tensor([0, 1, 2]))
    >>> agg.accumulate(torch.tensor([4.0, 8.0, 6.0]), weight=2.0)
    >>> agg.result().tolist()
    [3.0, 6.0, 6.0]
    """

    def __init__(self, *, dim: int, device: torch.device | str = "cpu") -> None:
        super().__init__()
        self.dim = int(dim)
        self.sums = torch.zeros(2 * self.dim, dtype=torch.float64, device=device)
        self._indices: Tensor | None = None

    def expect(self, indices: Tensor) -> None:
        """The coordinates of the next upload."""
        self._indices = indices

    def accumulate(self, decoded: Tensor, *, weight: float) -> None:
        if self._indices is None:
            raise RuntimeError("SliceWeightedMean needs the upload's index set (expect) before each upload.")
        idx, self._indices = self._indices.to(self.sums.device), None
        flat = decoded.reshape(-1)
        if flat.numel() != idx.numel():
            raise ValueError(f"An upload of {flat.numel()} entries does not fill its slice of {idx.numel()}.")
        self.sums[: self.dim].index_add_(0, idx, flat.to(self.sums), alpha=float(weight))
        self.sums[self.dim :].index_add_(0, idx, torch.full_like(idx, 1, dtype=torch.float64), alpha=float(weight))
        self.count += 1

    def coverage(self) -> Tensor:
        """Σ_i c_i of every coordinate (0 where no upload held it)."""
        return self.sums[self.dim :]

    def result(self, dtype: torch.dtype = torch.float32) -> Tensor:
        """Per coordinate Σ c_i x_i / Σ c_i over the uploads holding it; 0 where none did."""
        weight = self.coverage()
        mean = torch.where(weight > 0, self.sums[: self.dim] / weight.clamp_min(1e-300), torch.zeros_like(weight))
        return mean.to(dtype)


class SliceChannel(Channel):
    """The uplink of sub-model slices: a layer-wise operator sees the slice's own parameter blocks.

    A slice of n entries is cut into the kept parts of each parameter tensor (registered with
    :meth:`register_slice`), so ``granularity=layer`` compresses each layer's slice on its own.
    """

    def __init__(self, *, fixed_slices: bool = True, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.slice_blocks: dict[int, list[int] | None] = {}  # None: two slices of one length, different layers
        self.fixed_slices = fixed_slices

    @override
    def attach(self, compressor: Any, *, error_feedback: bool = False, **kwargs: Any) -> None:
        if error_feedback and not self.fixed_slices:
            raise ConfigError(
                f"{self.method} clients send a different random sub-model every round, which the error-feedback "
                f"memory of {compressor.name} cannot follow; set compressor.error_feedback=false."
            )
        if kwargs.get("granularity", "layer") == "layer" and None in self.slice_blocks.values():
            raise ConfigError(self._ambiguous(compressor.name))
        super().attach(compressor, error_feedback=error_feedback, **kwargs)

    def _ambiguous(self, name: str) -> str:
        return (
            f"Two sub-models of {self.method} have the same length but different layer shapes, so the layer-wise "
            f"compressor {name} cannot tell their layers apart; use compressor.granularity=model."
        )

    def register_slice(self, sizes: list[int]) -> None:
        """The parameter-block sizes of a slice (its length is their sum)."""
        numel = sum(sizes)
        if self.slice_blocks.setdefault(numel, sizes) != sizes:
            self.slice_blocks[numel] = None

    def operator(self, numel: int) -> Any:
        if self.compressor is not None and self.granularity == "layer" and numel in self.slice_blocks:
            sizes = self.slice_blocks[numel]
            if sizes is None:
                raise ConfigError(self._ambiguous(self.compressor.name))
            if numel not in self._operators:
                self._operators[numel] = self.compressor.blockwise(sizes) if len(sizes) > 1 else self.compressor
            return self._operators[numel]
        return super().operator(numel)


# ---------------------------------------------------------------------------------- the methods
class FjORD(FederatedModule):
    """FjORD (arXiv 2102.13451, Algorithm 10): ordered-dropout training over device tiers (module docstring).

    Args:
        widths: the width set 𝒫 (D_𝒫 is uniform over it), ascending, in (0, 1].
        tiers: device-tier capacities p_max^c, ascending (default: ``widths``, one tier per width).
        drop_scale: ds of :func:`tier_fractions`.
        distillation: self-distillation from the client's largest width (7.1).
        kd_alpha: α of (7.1).
        kd_temperature: T of (7.1).
        adaptive_dropout: d of FjORD + eFD (0: off).
        **kwargs: the :class:`FederatedModule` arguments (``aggregation`` must be ``normalised``).
    """

    per_client_downlink = True
    # The hooks that choose a client's sub-models are part of its local work: a subclass that
    # overrides one (eFD) is not served by the stacked local work of fjord_stacked.
    local_work_hooks = (
        *FederatedModule.local_work_hooks,
        "step_loss",
        "client_indices",
        "candidates",
        "teacher_width",
        "reach",
    )
    stateless_clients = True  # a client's width comes from its tier and its round stream; nothing is kept
    supported_aggregation = ("normalised",)
    fixed_slices: ClassVar[bool] = True
    """Every client sends the same coordinates every round (False: random sub-models)."""

    def __init__(
        self,
        *,
        widths: Sequence[float] = (0.2, 0.4, 0.6, 0.8, 1.0),
        tiers: Sequence[float] | None = None,
        drop_scale: float = 1.0,
        distillation: bool = True,
        kd_alpha: float = 1.0,
        kd_temperature: float = 1.0,
        adaptive_dropout: float = 0.0,
        **kwargs: Any,
    ) -> None:
        name = type(self).__name__
        self.widths = _check_widths([float(p) for p in widths], "method.widths")
        self.tiers = _check_widths([float(p) for p in (tiers if tiers is not None else widths)], "method.tiers")
        if not 0.0 <= adaptive_dropout < 1.0:
            raise ConfigError(f"method.adaptive_dropout is d ∈ [0, 1) (got {adaptive_dropout}).")
        if not 0.0 <= kd_alpha <= 1.0 or kd_temperature <= 0:
            raise ConfigError(f"method.kd_alpha must lie in [0, 1] and method.kd_temperature be positive ({name}).")
        self._check_tiers()
        try:
            self.fractions = tier_fractions(len(self.tiers), float(drop_scale))
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        self.arch: ODArchitecture = od_architecture(kwargs["model"])
        super().__init__(**kwargs)
        if self.task != "classification":
            raise ConfigError(f"{name} reports accuracy at every width; use a classification data set.")
        self.drop_scale = float(drop_scale)
        self.distillation = bool(distillation)
        self.kd_alpha, self.kd_temperature = float(kd_alpha), float(kd_temperature)
        self.adaptive_dropout = float(adaptive_dropout)
        gen = torch_generator(seed=self.seed, round_idx=0, client_id=SERVER, purpose="fjord_tiers")
        self.client_tier = assign_tiers(self.num_clients, self.fractions, gen)
        self.uplink_channel = SliceChannel(
            direction="uplink",
            payload=self.uplink_payload,
            codec=Float32Codec(),
            method=name,
            fixed_slices=self.fixed_slices,
        )
        self._slices: dict[float, Tensor] = {}
        self._aggregator: SliceWeightedMean | None = None
        num_classes = int(self.datamodule.num_classes)
        self.width_scores = nn.ModuleDict(
            {
                f"{stage}{k}": MulticlassAccuracy(num_classes=num_classes, average="micro", sync_on_compute=False)
                for stage in ("val", "test")
                for k in range(len(self.evaluated_widths()))
            }
        )
        for p in self.slice_widths():
            self._register(ordered_units(self.arch.widths(), p))

    # ------------------------------------------------------------------ configuration
    def _check_tiers(self) -> None:
        if self.tiers[0] < self.widths[0] - 1e-12:
            raise ConfigError(
                f"Tier capacity {self.tiers[0]} is below the smallest width {self.widths[0]}, so those clients "
                "can run no sub-model; raise method.tiers or add a smaller width to method.widths."
            )

    def evaluated_widths(self) -> list[float]:
        """The widths whose accuracy is logged (``val/acc`` is the last)."""
        return list(self.widths)

    def reach(self, client_id: int) -> float:
        """The largest width client ``client_id`` may sample: p_max^i, or p_max^i/(1 − d) with adaptive dropout."""
        p_max = self.tiers[self.client_tier[client_id]]
        return min(p_max / (1.0 - self.adaptive_dropout), 1.0)

    def candidates(self, client_id: int) -> list[float]:
        """{p ∈ 𝒫 : p ≤ reach}: the widths this client samples from."""
        reach = self.reach(client_id)
        return [p for p in self.widths if p <= reach + 1e-12]

    def teacher_width(self, client_id: int) -> float:
        """max{p ∈ 𝒫 : p ≤ p_max^i}: the client's largest ordered sub-model (its KD teacher)."""
        p_max = self.tiers[self.client_tier[client_id]]
        return max(p for p in self.widths if p <= p_max + 1e-12)

    def slice_widths(self) -> list[float]:
        """The widths whose slices clients send and receive."""
        return sorted({max(self.candidates(c)) for c in range(self.num_clients)})

    def _register(self, units: Sequence[Tensor]) -> Tensor:
        parts = _slice_parts(self.model, self.arch, units)
        self.uplink_channel.register_slice([int(q.numel()) for q in parts])  # type: ignore[attr-defined]
        return torch.cat(parts)

    def slice_indices(self, p: float) -> Tensor:
        """Flat indices of F_p (cached)."""
        if p not in self._slices:
            self._slices[p] = sub_model_indices(self.model, self.arch, ordered_units(self.arch.widths(), p))
        return self._slices[p]

    def client_indices(self, client_id: int, round_idx: int) -> Tensor:
        """The coordinates client ``client_id`` receives and sends in ``round_idx``."""
        return self.slice_indices(max(self.candidates(client_id)))

    # ------------------------------------------------------------------ the round
    @override
    def client_downlink(self, *, client_id: int, round_idx: int, broadcast: Tensor) -> Tensor:
        return broadcast[self.client_indices(client_id, round_idx).to(broadcast.device)]

    @override
    def make_aggregator(self, round_idx: int) -> Aggregator:
        self._aggregator = SliceWeightedMean(dim=num_parameters(self.model), device=self.device)
        return self._aggregator

    @override
    def on_upload_decoded(self, *, client_id: int, round_idx: int, decoded: Tensor) -> None:
        assert self._aggregator is not None
        self._aggregator.expect(self.client_indices(client_id, round_idx))

    @override
    def server_delta(self, *, round_idx: int, aggregator: Aggregator) -> Tensor:
        assert isinstance(aggregator, SliceWeightedMean)
        return aggregator.result()

    @override
    def client_update(self, *, client_id: int, round_idx: int, received: Tensor) -> ClientResult:
        model = self.client_model
        idx = self.client_indices(client_id, round_idx).to(received.device)
        flat = flat_parameters(model)
        flat[idx] = received.to(flat)
        assign_flat_(model, flat)
        model.train()
        done = self.local_train(
            client_id=client_id,
            round_idx=round_idx,
            params=model.parameters(),
            batch_loss=self.step_loss(model, client_id=client_id, round_idx=round_idx),
        )
        upload = flat_parameters(model)[idx] - received
        return ClientResult(upload=upload, num_samples=done.num_samples, loss=done.loss)

    def step_loss(self, model: nn.Module, *, client_id: int, round_idx: int) -> StepLoss:
        """The loss of one local step: a width p from the client's stream, then (7.1) or CE on F_p."""
        gen = self.generator(round_idx, client_id, "fjord_width")
        candidates = self.candidates(client_id)
        teacher_p, p_max = self.teacher_width(client_id), self.tiers[self.client_tier[client_id]]
        widths = self.arch.widths()
        teacher_units = ordered_units(widths, teacher_p)

        def loss(x: Tensor, y: Tensor) -> Tensor:
            p = candidates[int(torch.randint(len(candidates), (1,), generator=gen))]
            if p > p_max + 1e-12:  # adaptive dropout: ⌈p_max·K_l⌉ random units of F_p
                units = random_units(widths, outer=p, inner=p_max, generator=gen)
            else:
                units = ordered_units(widths, p)
            student = self.arch.forward(model, x, units)
            if not self.distillation or p == teacher_p:
                return self.loss_fn(student, y)
            teacher = self.arch.forward(model, x, teacher_units)
            t = self.kd_temperature
            kd = F.kl_div(
                F.log_softmax(student / t, dim=1),
                F.log_softmax(teacher.detach() / t, dim=1),
                reduction="batchmean",
                log_target=True,
            )
            student_ce = self.loss_fn(student, y) if self.kd_alpha < 1 else student.new_zeros(())
            return self.loss_fn(teacher, y) + (1 - self.kd_alpha) * student_ce + self.kd_alpha * t * t * kd

        return loss

    # ------------------------------------------------------------------ the share at once (vectorised backend)
    def stacked_refusal(self) -> str | None:
        """Why the ``vectorised`` backend cannot train this run's clients at once (:mod:`.fjord_stacked`)."""
        return fjord_stacked.stacked_refusal(self)

    def stacked_client_updates(
        self, *, round_idx: int, share: list[int], received: Tensor, received_by_client: list[Tensor] | None = None
    ) -> list[ClientResult]:
        """:meth:`client_update` of every client of ``share`` at once, one vmapped pass per sub-model in use.

        ``received_by_client``: each client's decoded slice (the backend passes it, as FjORD has a
        per-client downlink); without it each slice is cut from the decoded broadcast ``received``.
        """
        return fjord_stacked.stacked_client_updates(
            self, round_idx=round_idx, share=share, received=received, received_by_client=received_by_client
        )

    # ------------------------------------------------------------------ evaluation at every width
    @override
    def forward(self, x: Tensor) -> Tensor:
        """The largest evaluated width."""
        return self.arch.forward(self.model, x, ordered_units(self.arch.widths(), self.evaluated_widths()[-1]))

    def _width_step(self, batch: tuple[Tensor, Tensor], stage: str) -> None:
        x, y = batch
        for k, p in enumerate(self.evaluated_widths()[:-1]):
            score: Metric = self.width_scores[f"{stage}{k}"]  # type: ignore[assignment]
            score.update(self.arch.forward(self.model, x, ordered_units(self.arch.widths(), p)), y)

    @override
    def evaluation_metrics(self, stage: Literal["val", "test"]) -> list[Metric]:
        scores = [cast(Metric, self.width_scores[f"{stage}{k}"]) for k in range(len(self.evaluated_widths()) - 1)]
        return [*super().evaluation_metrics(stage), *scores]

    @override
    def log_evaluation(self, stage: Literal["val", "test"]) -> None:
        super().log_evaluation(stage)
        widths = self.evaluated_widths()
        for k, p in enumerate(widths[:-1]):
            self.log(f"{stage}/acc@{width_name(p)}", cast(Metric, self.width_scores[f"{stage}{k}"]).compute())
        full = self.val_score if stage == "val" else self.test_score
        self.log(f"{stage}/acc@{width_name(widths[-1])}", full.compute())

    @override
    def validation_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> None:
        super().validation_step(batch, batch_idx)
        self._width_step(batch, "val")

    @override
    def test_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> None:
        super().test_step(batch, batch_idx)
        self._width_step(batch, "test")


class ExtendedFederatedDropout(FjORD):
    """eFD (thesis arXiv 2207.00392, ch. 7 baseline; FD of arXiv 1812.07210): one model F_width (module docstring).

    Args:
        width: the target width p of the model trained end to end.
        tiers: device-tier capacities (clients below ``width`` drop units at random to fit).
        drop_scale: ds of :func:`tier_fractions`.
        **kwargs: the :class:`FederatedModule` arguments.
    """

    fixed_slices = False

    def __init__(
        self,
        *,
        width: float = 1.0,
        tiers: Sequence[float] = (0.2, 0.4, 0.6, 0.8, 1.0),
        drop_scale: float = 1.0,
        **kwargs: Any,
    ) -> None:
        super().__init__(widths=[width], tiers=tiers, drop_scale=drop_scale, distillation=False, **kwargs)
        self._drawn: dict[int, Tensor] = {}  # this round's Federated-Dropout sub-models
        self._drawn_round = -1

    @override
    def _check_tiers(self) -> None:
        return  # clients below the width drop units at random

    @override
    def slice_widths(self) -> list[float]:
        return [self.widths[0]]

    def _units(self, client_id: int, round_idx: int) -> list[Tensor]:
        p, p_max = self.widths[0], self.tiers[self.client_tier[client_id]]
        if p_max >= p - 1e-12:
            return ordered_units(self.arch.widths(), p)
        gen = self.generator(round_idx, client_id, "fd_units")  # the server's draw for this client
        return random_units(self.arch.widths(), outer=p, inner=p_max, generator=gen)

    @override
    def client_indices(self, client_id: int, round_idx: int) -> Tensor:
        p, p_max = self.widths[0], self.tiers[self.client_tier[client_id]]
        if p_max >= p - 1e-12:
            return self.slice_indices(p)
        if self._drawn_round != round_idx:
            self._drawn, self._drawn_round = {}, round_idx
        if client_id not in self._drawn:
            self._drawn[client_id] = self._register(self._units(client_id, round_idx))
        return self._drawn[client_id]

    @override
    def step_loss(self, model: nn.Module, *, client_id: int, round_idx: int) -> StepLoss:
        units = self._units(client_id, round_idx)
        return lambda x, y: self.loss_fn(self.arch.forward(model, x, units), y)


def _slice_parts(model: nn.Module, arch: ODArchitecture, units: Sequence[Tensor]) -> list[Tensor]:
    """The index set of a sub-model, split by parameter tensor (flat indices, ascending)."""
    idx = sub_model_indices(model, arch, units)
    bounds = torch.tensor([0, *torch.cumsum(torch.tensor([q.numel() for q in model.parameters()]), 0).tolist()])
    counts = torch.bucketize(idx, bounds[1:], right=True).bincount(minlength=len(bounds) - 1)
    return list(torch.split(idx, counts.tolist()))


def _check_widths(widths: list[float], key: str) -> list[float]:
    if not widths:
        raise ConfigError(f"{key} is empty; give at least one width in (0, 1].")
    if any(not 0.0 < p <= 1.0 for p in widths):
        raise ConfigError(f"{key}={widths} has a width outside (0, 1]; every width rate p must satisfy 0 < p ≤ 1.")
    if any(b <= a for a, b in itertools.pairwise(widths)):
        raise ConfigError(f"{key}={widths} must be strictly ascending (e.g. [0.2, 0.4, 0.6, 0.8, 1.0]).")
    return widths
