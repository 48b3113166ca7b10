"""Flower 1.42 peer: Message-API ``ClientApp`` and ``ServerApp`` run by ``run_simulation`` (Ray).

Each client process keeps one ``nn.Module`` and the federation's index blocks (loaded once per
process, keyed by ``node_config["partition-id"]``); the server runs ``FedAvg`` with
``fraction_train = per_round / clients`` and the shared evaluation as ``evaluate_fn``;
``client_resources = {"num_cpus": 1}``. Flower samples its cohort itself (unseeded), so cohorts
differ from the other systems'.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

import torch
from args import parse
from common import Clock, evaluate, load_mnist, mlp, one_thread


def main() -> None:
    a = parse()
    one_thread()
    clock = Clock()
    import common  # importable in the Ray workers (PYTHONPATH): its caches live per process
    from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
    from flwr.clientapp import ClientApp
    from flwr.serverapp import Grid, ServerApp
    from flwr.serverapp.strategy import FedAvg
    from flwr.simulation import run_simulation

    client_app = ClientApp()

    @client_app.train()
    def train(msg: Message, context: Context) -> Message:
        common.one_thread()
        cfg = msg.content["config"]
        parts, x, y = common.cached_federation(str(cfg["root"]), int(cfg["clients"]), int(cfg["per_client"]), 0)
        pid = int(context.node_config["partition-id"])
        model = common.cached_model(int(cfg["seed"]))
        model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
        opt = torch.optim.SGD(model.parameters(), lr=float(cfg["lr"]))
        idx = parts[pid]
        seed = common.shuffle_seed(int(cfg["server-round"]), pid)
        order = idx[torch.randperm(len(idx), generator=torch.Generator().manual_seed(seed))]
        batch = int(cfg["batch"])
        for start in range(0, len(order), batch):
            b = order[start : start + batch]
            opt.zero_grad(set_to_none=True)
            torch.nn.functional.cross_entropy(model(x[b]), y[b]).backward()
            opt.step()
        reply = RecordDict(
            {"arrays": ArrayRecord(model.state_dict()), "metrics": MetricRecord({"num-examples": len(idx)})}
        )
        return Message(content=reply, reply_to=msg)

    server_app = ServerApp()
    _, _, xt, yt = load_mnist(a.root)
    net = mlp(a.seed)

    @server_app.main()
    def serve(grid: Grid, context: Context) -> None:
        def central(server_round: int, arrays: ArrayRecord) -> MetricRecord:
            net.load_state_dict(arrays.to_torch_state_dict())
            acc = evaluate(net, xt, yt)
            if server_round == 0:
                clock.first_round()  # the initial model's evaluation ends start-up
            else:
                clock.evaluated(acc)
            return MetricRecord({"acc": acc})

        strategy = FedAvg(
            fraction_train=a.per_round / a.clients,
            fraction_evaluate=0.0,
            min_train_nodes=a.per_round,
            min_available_nodes=a.clients,
        )
        config = {"root": a.root, "clients": a.clients, "per_client": a.per_client, "seed": a.seed}
        strategy.start(
            grid=grid,
            initial_arrays=ArrayRecord(net.state_dict()),
            num_rounds=a.rounds,
            train_config=ConfigRecord({**config, "lr": a.lr, "batch": a.batch}),
            evaluate_fn=central,
        )

    run_simulation(
        server_app=server_app,
        client_app=client_app,
        num_supernodes=a.clients,
        backend_config={"client_resources": {"num_cpus": 1, "num_gpus": 0.0}},
    )
    clock.emit()


if __name__ == "__main__":
    main()
