"""What a client does in a round, as a method says it: the engine's client hooks (a mixin of the engine).

A method overrides these hooks to change its clients' local work (its loss, a penalty on the
parameters, the step hook, the optimiser, the batches, or the whole ``client_update``); the
round's client runner (:mod:`fedlightning.federated.local`) executes them. The default is
FedAvg's client (arXiv 1602.05629): local SGD from the broadcast, uploading the model delta.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any, ClassVar, cast

import torch
from torch import Tensor, nn

from fedlightning.datamodules.base import FederatedDataModule
from fedlightning.datamodules.tensor_loader import may_reside_on
from fedlightning.federated.batches import Schedule, batch_schedule
from fedlightning.federated.local import ClientResult, ClientRunner, LocalProgram, LocalTraining, overrides
from fedlightning.federated.params import assign_flat_, flat_difference, unflatten_like
from fedlightning.federated.rng import torch_generator
from fedlightning.federated.rounds import RoundContext

if TYPE_CHECKING:
    from fedlightning.federated.module import FederatedModule

__all__ = ["ClientWork", "ParamsT", "ignored_penalty"]

ParamsT = Iterable[Tensor] | Iterable[dict[str, Any]]


def ignored_penalty(cls: type) -> str | None:
    """Why ``cls``'s ``local_penalty`` would be ignored: its own ``client_update``, not the engine's, trains it."""
    if overrides(cls, ClientWork, "local_penalty") and overrides(cls, ClientWork, "client_update"):
        return (
            f"{cls.__name__} defines local_penalty but has its own client_update, which does not add it to the "
            "local loss (the engine's client_update does); add the term to its local_loss instead."
        )
    return None


class ClientWork(RoundContext):
    """The client hooks of :class:`~fedlightning.federated.module.FederatedModule`."""

    local_work_hooks: ClassVar[tuple[str, ...]] = ("client_update", "local_train", "local_loss", "on_local_step_end")
    """The hooks that make up a client's local work: a backend that serves a class's local work
    serves a subclass that overrides none of them."""
    hand_stepped: ClassVar[bool] = False
    """True: the method's clients take their steps by hand on the ``fused`` backend's layers
    (:attr:`ClientRunner.layers`) when it runs, with any client optimiser."""

    # set by the engine's constructor
    loss_fn: nn.Module
    local_runner: ClientRunner
    batch_size: int
    local_epochs: int
    local_steps: int | None
    max_grad_norm: float | None
    seed: int

    @property
    def client_model(self) -> nn.Module:
        """The one reusable model that every client trains in turn."""
        return self.__dict__["_client_model"]

    @property
    def datamodule(self) -> FederatedDataModule:
        """The federated data: client tensors, sizes, validation and test loaders."""
        return self.__dict__["_datamodule"]

    def generator(self, round_idx: int, client_id: int, purpose: str) -> torch.Generator:
        """The CPU generator of stream (run seed, round, client, purpose)."""
        return torch_generator(seed=self.seed, round_idx=round_idx, client_id=client_id, purpose=purpose)

    # ------------------------------------------------------------------ method hooks: client
    def local_loss(self, model: nn.Module, x: Tensor, y: Tensor) -> Tensor:
        """Loss of one local mini-batch (default: cross-entropy)."""
        return self.loss_fn(model(x), y)

    def local_penalty(self, params: Mapping[str, Tensor], received: Mapping[str, Tensor]) -> Tensor | None:
        """A term added to every local mini-batch loss, of the client's parameters and the ones it received.

        ``None`` (the default): no term. A pure function of its arguments (e.g. FedProx's
        (μ/2)‖w − w_t‖²), so every backend adds it: the loop to the model's loss, the vectorised
        backend inside its batched loss.
        """
        return None

    def make_client_optimizer(self, params: ParamsT, *, client_id: int, round_idx: int) -> torch.optim.Optimizer:
        """The optimiser of one client in one round (override for per-client step sizes)."""
        factory = self._round_optimizer if self._round_optimizer is not None else self.client_optimizer
        return factory(params)

    def on_local_step_end(self, model: nn.Module) -> None:
        """Called after each local optimiser step of the default client (e.g. a projection)."""

    def client_update(self, *, client_id: int, round_idx: int, received: Tensor) -> ClientResult:
        """Local training on one client from the broadcast it decoded; uploads the model delta."""
        model = self.client_model
        assign_flat_(model, received)
        if not model.training:
            model.train()
        batch_loss: Callable[[Tensor, Tensor], Tensor] = lambda x, y: self.local_loss(model, x, y)  # noqa: E731
        if type(self).local_penalty is not ClientWork.local_penalty:
            params = dict(model.named_parameters())
            start = dict(zip(params, unflatten_like(received, params.values()), strict=True))  # views, no copy

            def batch_loss(x: Tensor, y: Tensor) -> Tensor:
                loss = self.local_loss(model, x, y)
                penalty = self.local_penalty(params, start)
                return loss if penalty is None else loss + penalty

        done = self.local_train(
            client_id=client_id,
            round_idx=round_idx,
            params=model.parameters(),
            batch_loss=batch_loss,
            after_step=lambda: self.on_local_step_end(model),
        )
        upload = flat_difference(model, received)  # w_k − w, one pass per parameter
        return ClientResult(upload=upload, num_samples=done.num_samples, loss=done.loss)

    # ------------------------------------------------------------------ the local-training routine
    def local_train(
        self,
        *,
        client_id: int,
        round_idx: int,
        params: ParamsT,
        batch_loss: Callable[[Tensor, Tensor], Tensor],
        after_step: Callable[[], None] | None = None,
        after_epoch: Callable[[int], bool] | None = None,
        writes_gradients: bool = False,
    ) -> LocalTraining:
        """Local mini-batch training of ``params`` on one client's data, in place, by the round's runner.

        Runs ``local_epochs`` (or ``local_steps``) steps with the optimiser of
        :meth:`make_client_optimizer`: batches and augmentation from the client's own streams,
        ``batch_loss(x, y)`` (which may draw from its own streams, e.g. masks or gates),
        ``loss.backward()``, clipping to ``max_grad_norm``, the optimiser step, then
        ``after_step()``. ``after_epoch(epochs_done)`` is called after each whole pass over
        the data (``local_epochs`` mode only) and ends local training by returning true
        (client-side early stopping; ``local_epochs`` is then the cap). With
        ``writes_gradients``, ``batch_loss`` writes every trained parameter's gradient itself
        (a step taken by hand, e.g. :meth:`fedlightning.models.sampled_network.SampledNetwork.fused_gradient_`)
        and returns the loss: no backward pass is run. The ``fused`` backend takes the engine's
        own cross-entropy steps by hand (:mod:`fedlightning.federated.local.fused`).
        """
        program = LocalProgram(
            params=params,
            batch_loss=batch_loss,
            after_step=after_step,
            after_epoch=after_epoch,
            writes_gradients=writes_gradients,
        )
        engine = cast("FederatedModule", self)
        return self.local_runner.train(engine, client_id=client_id, round_idx=round_idx, program=program)

    # ------------------------------------------------------------------ helpers for methods
    def client_data(self, client_id: int) -> tuple[Tensor, Tensor]:
        """The client's features and targets, on this module's device.

        On an accelerator the clients' data are copied there once (:meth:`resident_train_data`)
        and each client's are a slice of that copy; otherwise they are copied per call.
        """
        resident = self.resident_train_data()
        span = self.datamodule.client_span(client_id) if resident is not None else None
        if resident is not None and span is not None:
            return resident[0][span[0] : span[1]], resident[1][span[0] : span[1]]
        x, y = self.datamodule.client_tensors(client_id)
        return x.to(self.device, non_blocking=True), y.to(self.device, non_blocking=True)

    def resident_train_data(self) -> tuple[Tensor, Tensor] | None:
        """Every client's data where this module computes, each client's a slice (``None`` where it is not kept so).

        Where the datamodule stores its clients as slices
        (:meth:`~fedlightning.datamodules.base.FederatedDataModule.client_span`): on a CPU its own
        tensors (nothing is copied); on an accelerator a copy made once, kept when the data take
        at most a quarter of the device's memory.
        """
        device, dm = self.device, self.datamodule
        if not hasattr(dm, "train_tensors") or overrides(type(dm), FederatedDataModule, "client_tensors"):
            return None  # (a datamodule that serves its clients' tensors its own way is asked for each)
        if device.type == "cpu":
            return dm.train_tensors() if dm.client_span(0) is not None else None
        decided = self.__dict__.get("_resident_data")  # (device, the copy or None): decided once per device
        if decided is not None and decided[0] == device:
            return decided[1]
        resident = None
        if dm.client_span(0) is not None:
            x, y = dm.train_tensors()
            if may_reside_on(device, x.numel() * x.element_size() + y.numel() * y.element_size()):
                resident = (x.to(device), y.to(device))
        self.__dict__["_resident_data"] = (device, resident)  # not a registered buffer: never checkpointed
        return resident

    def client_batches(self, *, client_id: int, round_idx: int, num_samples: int) -> Iterable[Tensor]:
        """Mini-batch indices of one client in one round, from its own random stream.

        The batches :func:`~fedlightning.federated.batches.local_batches` draws.
        """
        return self._own_schedule(client_id=client_id, round_idx=round_idx, num_samples=num_samples).batches()

    def client_schedule(self, *, client_id: int, round_idx: int, num_samples: int) -> Schedule:
        """:meth:`client_batches` as one :class:`~fedlightning.federated.batches.Schedule` (a share trained at once).

        Built without a loop over batches, unless a method gives its clients batches of its own
        (then those batches, gathered).
        """
        if type(self).client_batches is not ClientWork.client_batches:
            return Schedule.of(self.client_batches(client_id=client_id, round_idx=round_idx, num_samples=num_samples))
        return self._own_schedule(client_id=client_id, round_idx=round_idx, num_samples=num_samples)

    def _own_schedule(self, *, client_id: int, round_idx: int, num_samples: int) -> Schedule:
        """The engine's schedule: ``local_epochs`` passes (or ``local_steps`` steps) from the client's stream."""
        return batch_schedule(
            num_samples=num_samples,
            batch_size=self.batch_size,
            epochs=self.local_epochs,
            steps=self.local_steps,
            generator=self.generator(round_idx, client_id, "batches"),
        )
