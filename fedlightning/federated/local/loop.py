"""The ``loop`` backend: each client in turn, with autograd; it serves every method."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

import torch
from torch import Tensor, nn

from fedlightning.errors import ConfigError
from fedlightning.federated.batches import gathered_batches
from fedlightning.federated.local.base import ClientRunner, LocalProgram, LocalTraining
from fedlightning.federated.local.steps import clear_grads_, in_place_step

if TYPE_CHECKING:
    from fedlightning.federated.module import FederatedModule

__all__ = ["LoopRunner"]


class LoopRunner(ClientRunner):
    """``loop``: each client in turn, ``loss.backward()`` and the client optimiser's step."""

    name = "loop"

    def train(self, module: FederatedModule, *, client_id: int, round_idx: int, program: LocalProgram) -> LocalTraining:
        """Local mini-batch training of ``program.params`` on one client's data, in place.

        Runs ``module.local_epochs`` (or ``module.local_steps``) steps with the optimiser of
        ``module.make_client_optimizer``: batches and augmentation from the client's own
        streams, ``program.batch_loss(x, y)``, ``loss.backward()`` (unless the program writes
        its gradients), clipping to ``module.max_grad_norm``, the optimiser step, then
        ``program.after_step()``; ``program.after_epoch(passes)`` may end training after a
        whole pass (``local_epochs`` mode only).
        """
        optimizer = module.make_client_optimizer(program.params, client_id=client_id, round_idx=round_idx)
        return self._autograd_steps(
            module, client_id=client_id, round_idx=round_idx, program=program, optimizer=optimizer
        )

    def _autograd_steps(
        self,
        module: FederatedModule,
        *,
        client_id: int,
        round_idx: int,
        program: LocalProgram,
        optimizer: torch.optim.Optimizer,
    ) -> LocalTraining:
        trained = [p for group in optimizer.param_groups for p in group["params"]]
        step_in_place = in_place_step(optimizer)  # plain SGD or Adam: the same update without step()'s wrappers

        def step(x: Tensor, y: Tensor) -> Tensor:
            clear_grads_(trained)
            loss = program.batch_loss(x, y)
            if not program.writes_gradients:
                loss.backward()
            if module.max_grad_norm is not None:
                nn.utils.clip_grad_norm_(trained, module.max_grad_norm)
            if step_in_place is not None:
                step_in_place(optimizer)
            else:
                optimizer.step()
            return loss

        return self._run_steps(
            module, client_id=client_id, round_idx=round_idx, program=program, step=step, optimizer=optimizer
        )

    def _run_steps(
        self,
        module: FederatedModule,
        *,
        client_id: int,
        round_idx: int,
        program: LocalProgram,
        step: Callable[[Tensor, Tensor], Tensor],
        optimizer: torch.optim.Optimizer,
    ) -> LocalTraining:
        """The schedule shared by the sequential backends: ``step(x, y)`` on each planned batch."""
        if program.after_epoch is not None and module.local_steps is not None:
            raise ConfigError(
                "Client-side early stopping counts local epochs; set method.local_steps=null and cap the "
                "epochs with method.local_epochs."
            )
        x, y = module.client_data(client_id)
        augment_gen = module.generator(round_idx, client_id, "augment")
        loss_sum = torch.zeros((), device=module.device)
        steps = 0
        per_epoch = math.ceil(len(y) / module.batch_size) if module.local_steps is None else 0
        batches: Iterable[Tensor] = module.client_batches(client_id=client_id, round_idx=round_idx, num_samples=len(y))
        if module.cuts_local_steps:  # e.g. stragglers: at most a budget of the planned steps
            planned = list(batches)
            batches = planned[
                : module.local_step_budget(client_id=client_id, round_idx=round_idx, planned=len(planned))
            ]
        for x_batch, y_batch in gathered_batches(x, y, batches):
            loss = step(module.datamodule.augment(x_batch, augment_gen), y_batch)
            if steps == 0:
                module.record_start_losses(loss.detach().reshape(1))  # the loss of the received model
            if program.after_step is not None:
                program.after_step()
            loss_sum += loss.detach()
            steps += 1
            if program.after_epoch is not None and steps % per_epoch == 0 and program.after_epoch(steps // per_epoch):
                break
        return LocalTraining(
            loss=loss_sum / max(steps, 1),
            steps=steps,
            num_samples=len(y),
            optimizer=optimizer,
            epochs=steps // per_epoch if per_epoch else 0,
        )
