"""Peak memory of a round with 10 vs 100 clients per round (the server's sums do not grow with K).

MNIST ``mnistfc``, 100 IID clients, uniform sampling of K ∈ {10, 100} clients per round,
2 rounds, one torch thread. Each K runs in a fresh process, which reports its peak resident
memory (``ru_maxrss``); the ratio of the peaks (K = 100 over K = 10) is the figure to read
(target ≤ 1.1). A server that kept the K
dense uploads would add K × 266,610 × 4 bytes (about 107 MB at K = 100).

    python benchmarks/round_memory.py --data-root ../shared/data
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile


def worker(data_root: str, clients_per_round: int, folder: str) -> None:
    """Run the workload in this process and print its peak resident memory as JSON."""
    from hydra import compose, initialize_config_dir

    from fedlightning.cli import config_dir
    from fedlightning.run import run

    overrides = [
        "data=mnist",
        "model=mnistfc",
        "partition=iid",
        "data.num_clients=100",
        f"data.root={data_root}",
        "sampler=uniform",
        f"clients_per_round={clients_per_round}",
        "rounds=2",
        "eval_every=2",
        "logger=none",
        "checkpoint_every=0",
        "save_partition=false",
        "trainer.enable_progress_bar=false",
    ]
    with initialize_config_dir(config_dir=config_dir(), version_base="1.3"):
        cfg = compose(config_name="train", overrides=overrides)
    run(cfg, folder)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # kB on Linux
    print(json.dumps({"clients_per_round": clients_per_round, "peak_mb": peak}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-root", required=True)
    parser.add_argument("--worker", type=int, default=None)
    parser.add_argument("--folder", default=None)
    args = parser.parse_args()
    if args.worker is not None:
        worker(args.data_root, args.worker, args.folder)
        return
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for k in (10, 100):
            out = subprocess.run(
                [
                    sys.executable,
                    __file__,
                    "--data-root",
                    args.data_root,
                    "--worker",
                    str(k),
                    "--folder",
                    f"{tmp}/k{k}",
                ],
                check=True,
                capture_output=True,
                text=True,
                env={**os.environ, "WANDB_MODE": "disabled"},
            )
            results[k] = json.loads(out.stdout.strip().splitlines()[-1])
            print(results[k], flush=True)
    ratio = results[100]["peak_mb"] / results[10]["peak_mb"]
    print(
        f"peak memory, 100 vs 10 clients per round: {results[100]['peak_mb']:.0f} MB vs "
        f"{results[10]['peak_mb']:.0f} MB, ratio {ratio:.3f} (target <= 1.1)"
    )


if __name__ == "__main__":
    main()
