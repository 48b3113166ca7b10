"""Table of a FedShuffle comparison multirun (experiment ``fedshuffle_heterogeneous[_quick]``).

    python benchmarks/fedshuffle_table.py MULTIRUN_DIR [MULTIRUN_DIR ...] [--best-by train_objective]

For every run folder (``summary.json``): the test accuracy, the federated training objective
f(x) = Σ_i (|D_i|/|D|) f_i(x) of the final model (recomputed here from ``checkpoints/last.ckpt``
on every client's training data: the mean local loss that the engine logs as ``train/loss``
is taken along the local trajectories, not at the global model) and the last logged
``diag/objective_weight_tv``. Rows are (method, local lr) with mean ± sd over the seeds; a
second table keeps, per method, the lr with the lowest mean ``--best-by`` metric.
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics
from collections import defaultdict
from pathlib import Path
from typing import Any

import torch
from hydra.utils import instantiate
from omegaconf import OmegaConf
from torch import nn

from fedlightning.models import ModelInputs

METHODS = ("fedshuffle", "fedavg_epochs", "fednova", "fedavg_min", "fedavg_mean")


def training_objective(run_dir: Path, summary: dict[str, Any]) -> float:
    """Σ_i Σ_j loss(x; z_ij) / |D| over every client's training data, at the final global model."""
    cfg = OmegaConf.create(summary["config"])
    partition = instantiate(cfg.partition)
    datamodule = instantiate(cfg.data, _partial_=True)(partition=partition, seed=int(cfg.seed))
    datamodule.setup("fit")
    inputs = ModelInputs(
        shape=tuple(datamodule.input_shape), num_classes=datamodule.num_classes, data_name=summary["data"]
    )
    model = instantiate(cfg.model, _partial_=True)(inputs=inputs)
    state = torch.load(run_dir / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)["state_dict"]
    model.load_state_dict({k.removeprefix("model."): v for k, v in state.items() if k.startswith("model.")})
    model.eval()
    total, count = 0.0, 0
    loss = nn.CrossEntropyLoss(reduction="sum")
    with torch.no_grad():
        for cid in range(datamodule.num_clients):
            x, y = datamodule.client_tensors(cid)
            total += float(loss(model(datamodule.transform(x)), y))
            count += len(y)
    return total / count


def last_logged(run_dir: Path, key: str) -> float:
    with (run_dir / "csv" / "metrics.csv").open() as handle:
        values = [row[key] for row in csv.DictReader(handle) if row.get(key)]
    return float(values[-1])


def collect(dirs: list[Path]) -> dict[tuple[str, str], list[dict[str, float]]]:
    cells: dict[tuple[str, str], list[dict[str, float]]] = defaultdict(list)
    for top in dirs:
        for path in sorted(top.rglob("summary.json")):
            summary = json.loads(path.read_text())
            run_dir = path.parent
            lr = str(summary["config"]["method"]["client_optimizer"]["lr"])
            cells[(summary["method"], lr)].append(
                {
                    "test_acc": float(summary["test/acc"]),
                    "train_objective": training_objective(run_dir, summary),
                    "tv": last_logged(run_dir, "diag/objective_weight_tv"),
                    "seed": float(summary["seed"]),
                }
            )
    return cells


def fmt(values: list[float], digits: int) -> str:
    if len(values) == 1:
        return f"{values[0]:.{digits}f}"
    return f"{statistics.mean(values):.{digits}f} ± {statistics.stdev(values):.{digits}f}"


def table(cells: dict[tuple[str, str], list[dict[str, float]]], keys: list[tuple[str, str]]) -> str:
    lines = [
        "| method | local lr η_l | seeds | test acc | train objective f(x) | diag/objective_weight_tv |",
        "|---|---|---|---|---|---|",
    ]
    for method, lr in keys:
        runs = cells[(method, lr)]
        lines.append(
            f"| {method} | {lr} | {len(runs)} | {fmt([r['test_acc'] for r in runs], 3)} | "
            f"{fmt([r['train_objective'] for r in runs], 3)} | {fmt([r['tv'] for r in runs], 3)} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("dirs", nargs="+", type=Path)
    parser.add_argument("--best-by", choices=("train_objective", "test_acc"), default="train_objective")
    args = parser.parse_args()
    cells = collect(args.dirs)
    order = {m: i for i, m in enumerate(METHODS)}
    keys = sorted(cells, key=lambda k: (order.get(k[0], len(order)), float(k[1])))
    print(table(cells, keys))
    sign = -1.0 if args.best_by == "test_acc" else 1.0
    best = []
    for method in sorted({m for m, _ in keys}, key=lambda m: order.get(m, len(order))):
        lrs = [k for k in keys if k[0] == method]
        best.append(min(lrs, key=lambda k: sign * statistics.mean(r[args.best_by] for r in cells[k])))
    print(f"\nBest local lr per method (by mean {args.best_by}):\n")
    print(table(cells, best))


if __name__ == "__main__":
    main()
