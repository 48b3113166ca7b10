"""Seconds from launch to exit of a refused ``fedlightning`` command: wall and CPU, median of N launches.

    python benchmarks/refusal_time.py --runs 5 [--tree A --tree B ...] [--json out.json]

Each launch is a fresh ``python -m fedlightning.cli <overrides>`` that the config refuses (the
cases below, from ``tests/test_refusal_catalogue.py``), in each ``--tree``'s checkout (default:
this one), the trees interleaved launch by launch so that the machine's load falls on all of them
alike. ``$FEDLIGHTNING_CACHE`` is a folder of this benchmark in which one unmeasured refusal has
left the tree's target index (``fedlightning/target_index.py``), as on a machine that ran any
command before; a checkout without the index is timed the same way. CPU is the launched process's
user + system seconds.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
CASES = {
    "misspelt key (rouns=3)": ["rouns=3"],
    "method x compressor (zampling, top_k)": ["method=zampling", "compressor=top_k"],
    "unbiased uplink (diana, top_k)": ["method=diana", "compressor=top_k"],
    "downlink scheme (top_k, aggregate)": ["downlink=top_k", "downlink.scheme=aggregate"],
    "GPU this machine lacks": ["trainer.accelerator=gpu"],
    "ignored report setting": ["method=fedavg", "reports.zampling_evaluation.test_samples=5"],
    "constructor key (+partition.alfa)": ["+partition.alfa=1"],
    "operator setting (top_k fraction=0)": ["compressor=top_k", "compressor.compressor.fraction=0"],
}


def launch(tree: Path, overrides: list[str], cache: Path) -> tuple[float, float]:
    """Wall and CPU seconds of one refused command (it must exit with status 1)."""
    env = {**os.environ, "PYTHONPATH": str(tree), "FEDLIGHTNING_CACHE": str(cache), "WANDB_MODE": "disabled"}
    env.pop("HYDRA_FULL_ERROR", None)
    with tempfile.TemporaryDirectory() as cwd:
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        begin = time.perf_counter()
        done = subprocess.run(
            [sys.executable, "-m", "fedlightning.cli", *overrides],
            cwd=cwd,
            env=env,
            text=True,
            capture_output=True,
            check=False,
        )
        wall = time.perf_counter() - begin
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 1:
        raise SystemExit(f"{overrides} in {tree} was not refused ({done.returncode}): {done.stderr[-2000:]}")
    return wall, after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--tree", type=Path, action="append", help="a checkout to time (repeatable)")
    parser.add_argument("--json", type=Path, help="write the medians here")
    args = parser.parse_args()
    trees = [t.resolve() for t in (args.tree or [HERE.parent])]
    results: dict[str, dict[str, dict[str, float]]] = {str(t): {} for t in trees}
    with tempfile.TemporaryDirectory() as scratch:
        caches = {t: Path(scratch) / f"cache{i}" for i, t in enumerate(trees)}
        for tree in trees:  # the index an earlier command leaves (a tree without one just refuses)
            launch(tree, ["method=zampling", "compressor=top_k"], caches[tree])
        for name, overrides in CASES.items():
            times: dict[Path, list[tuple[float, float]]] = {t: [] for t in trees}
            for _ in range(args.runs):
                for tree in trees:
                    times[tree].append(launch(tree, overrides, caches[tree]))
            for tree in trees:
                wall = statistics.median(w for w, _ in times[tree])
                cpu = statistics.median(c for _, c in times[tree])
                results[str(tree)][name] = {"wall_s": round(wall, 3), "cpu_s": round(cpu, 3)}
                print(f"{tree.name:>12} | {name:<40} | wall {wall:5.2f} s | CPU {cpu:5.2f} s", flush=True)
    if args.json:
        args.json.write_text(json.dumps({"runs": args.runs, "results": results}, indent=2))


if __name__ == "__main__":
    main()
