"""pfl-research 0.6 peer: ``SimulatedBackend`` + ``FederatedAveraging`` over in-memory users.

Run with one process, or under ``torchrun --nproc_per_node=2`` (gloo, one thread each), pfl's
own process-per-core recipe. Central evaluation is a callback calling the shared evaluation
function; ``evaluation_frequency`` is set past the last round so pfl skips its own per-user
evaluation. pfl trains a user's data in stored order (no shuffle).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch
from args import cohort, parse
from common import Clock, evaluate, iid_clients, load_mnist, mlp, one_thread


class _Net(torch.nn.Module):
    """The shared MLP with the ``loss``/``metrics`` methods pfl's PyTorchModel calls."""

    def __init__(self, seed: int) -> None:
        super().__init__()
        self.net = mlp(seed)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def loss(self, x: torch.Tensor, y: torch.Tensor, eval: bool = False) -> torch.Tensor:
        return torch.nn.functional.cross_entropy(self(x), y)

    @torch.no_grad()
    def metrics(self, x: torch.Tensor, y: torch.Tensor, eval: bool = False) -> dict:
        from pfl.metrics import Weighted

        return {"loss": Weighted(float(torch.nn.functional.cross_entropy(self(x), y, reduction="sum")), len(y))}


def main() -> None:
    a = parse()
    one_thread()
    clock = Clock()
    from pfl.aggregate.simulate import SimulatedBackend
    from pfl.algorithm import FederatedAveraging, NNAlgorithmParams
    from pfl.callback.base import TrainingProcessCallback
    from pfl.data.dataset import Dataset
    from pfl.data.federated_dataset import FederatedDataset
    from pfl.hyperparam import NNEvalHyperParams, NNTrainHyperParams
    from pfl.metrics import Metrics
    from pfl.model.pytorch import PyTorchModel

    x, y, xt, yt = load_mnist(a.root)
    parts = iid_clients(len(y), a.clients, a.per_client, a.seed)
    users = {str(k): (x[p], y[p]) for k, p in enumerate(parts)}
    # The same seeded cohorts as the other systems: a sampler replaying them user by user.
    rank = int(os.environ.get("RANK", 0))
    queue: list[str] = []
    state = {"round": 0}

    def next_user() -> str:
        if not queue:
            state["round"] += 1
            queue.extend(str(c) for c in cohort(state["round"], a.clients, a.per_round, a.seed))
        return queue.pop(0)

    data = FederatedDataset(lambda uid: Dataset(raw_data=list(users[uid]), user_id=uid), next_user)
    net = _Net(a.seed)
    model = PyTorchModel(
        model=net,
        local_optimizer_create=torch.optim.SGD,
        central_optimizer=torch.optim.SGD(net.parameters(), lr=1.0),
    )

    class Evaluate(TrainingProcessCallback):
        def on_train_begin(self, *, model):  # type: ignore[no-untyped-def]
            clock.first_round()
            return Metrics()

        def after_central_iteration(self, aggregate_metrics, model, *, central_iteration):  # type: ignore[no-untyped-def]
            if rank == 0:  # the central model is the same on every rank: evaluate it once
                clock.evaluated(evaluate(net, xt, yt))
            return False, Metrics()

    FederatedAveraging().run(
        algorithm_params=NNAlgorithmParams(
            central_num_iterations=a.rounds,
            evaluation_frequency=a.rounds + 1,
            train_cohort_size=a.per_round,
            val_cohort_size=None,
        ),
        backend=SimulatedBackend(training_data=data, val_data=None),
        model=model,
        model_train_params=NNTrainHyperParams(local_learning_rate=a.lr, local_num_epochs=1, local_batch_size=a.batch),
        model_eval_params=NNEvalHyperParams(local_batch_size=10_000),
        callbacks=[Evaluate()],
        send_metrics_to_platform=False,
    )
    if rank == 0:
        clock.emit()


if __name__ == "__main__":
    main()
