"""One FedAvg round on 1 process vs the cohort sharded over 2 processes (``trainer=ddp``).

Workload S1: MNIST ``mnistfc``, 10 IID clients × 6,000 samples (``data.val_fraction=0``: the
whole training set is partitioned), 1 local epoch, batch 32, plain SGD lr 0.05, one torch
thread per process (gloo on the CPU). Each configuration is run ``--repeats`` times,
interleaved (1, 2, 1, 2, ...), through the real command; the round time is the engine's
``time/round_s`` of the first process, which includes the all-reduce of the aggregator and
the bit counters. Prints the median round time of each and the ratio 2-process / 1-process
(ideal 0.5 on 2 cores).

    python benchmarks/distributed_round.py --data-root ../shared/data --rounds 6 --repeats 2
"""

from __future__ import annotations

import argparse
import csv
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

S1 = [
    "data=mnist",
    "model=mnistfc",
    "partition=iid",
    "data.num_clients=10",
    "data.val_fraction=0",
    "method.local_epochs=1",
    "method.batch_size=32",
    "method.client_optimizer.lr=0.05",
    "method.client_optimizer.momentum=0.0",
    "method.client_optimizer.nesterov=false",
    "threads=1",
    "checkpoint_every=0",
    "save_partition=false",
    "trainer.enable_progress_bar=false",
    "logger=csv",
]


def round_times(data_root: str, rounds: int, processes: int, folder: Path) -> list[float]:
    """``time/round_s`` of every round of one run."""
    extra = ["trainer=ddp", f"trainer.devices={processes}"] if processes > 1 else []
    command = [
        sys.executable,
        "-m",
        "fedlightning.cli",
        *S1,
        f"data.root={data_root}",
        f"rounds={rounds}",
        f"eval_every={rounds}",
        *extra,
        f"hydra.run.dir={folder}",
    ]
    env = {**os.environ, "WANDB_MODE": "disabled"}
    subprocess.run(command, check=True, env=env, capture_output=True)
    times = []
    for path in folder.rglob("metrics.csv"):
        with path.open() as handle:
            times += [float(row["time/round_s"]) for row in csv.DictReader(handle) if row.get("time/round_s")]
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-root", required=True)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    measured: dict[int, list[float]] = {1: [], 2: []}
    with tempfile.TemporaryDirectory() as tmp:
        for repeat in range(args.repeats):
            for processes in (1, 2):
                times = round_times(args.data_root, args.rounds, processes, Path(tmp) / f"p{processes}-r{repeat}")
                measured[processes] += times
                print(f"{processes} process(es), repeat {repeat}: " + " ".join(f"{t:.3f}" for t in times), flush=True)
    one, two = statistics.median(measured[1]), statistics.median(measured[2])
    print(f"1 process:   median round {one:.3f} s over {len(measured[1])} rounds")
    print(f"2 processes: median round {two:.3f} s over {len(measured[2])} rounds")
    print(f"ratio 2 / 1: {two / one:.3f} (target <= 0.6, ideal 0.5)")


if __name__ == "__main__":
    main()
