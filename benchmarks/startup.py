"""Launch to first round of the ``fedlightning`` command: wall and CPU seconds, median of N runs.

    python benchmarks/startup.py --runs 5 [--tree /work/main] [--label after] -- rounds=1 [override ...]

Each run is a fresh ``python -m fedlightning.cli <overrides>`` (one at a time; ``-m``, which
Lightning's own DDP launcher needs to re-run the command), in ``--tree``'s checkout (default:
this one), with this file's :class:`FirstRound` as a callback (``PYTHONPATH`` holds
``benchmarks/``); its run folder goes under ``--out``. Wall is from just before the launch to the
start of round 1; CPU is the first process's user + system seconds at that point (the load of
other processes inflates wall far more than CPU).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import lightning as L

HERE = Path(__file__).resolve().parent
LINE = re.compile(r"first round: wall ([\d.]+) s, CPU ([\d.]+) s")


class FirstRound(L.Callback):
    """Prints wall seconds since ``$T0`` and this process's CPU seconds when round 1 starts."""

    def on_train_batch_start(self, trainer: L.Trainer, *args: Any) -> None:
        if trainer.global_step == 0:
            launched = float(os.environ.get("T0", "nan"))
            print(f"first round: wall {time.time() - launched:.3f} s, CPU {time.process_time():.3f} s", flush=True)


def one(tree: Path, overrides: list[str], run_dir: Path) -> tuple[float, float]:
    env = {**os.environ, "T0": repr(time.time()), "PYTHONPATH": f"{tree}{os.pathsep}{HERE}"}
    env.pop("LOCAL_RANK", None)
    command = [
        sys.executable,
        "-m",
        "fedlightning.cli",
        *overrides,
        "+callbacks.first._target_=startup.FirstRound",
        f"hydra.run.dir={run_dir}",
    ]
    env["T0"] = repr(time.time())
    done = subprocess.run(command, cwd=tree, env=env, capture_output=True, text=True, check=False)
    found = LINE.findall(done.stdout)
    if done.returncode != 0 or not found:
        raise SystemExit(f"run failed ({done.returncode}): {done.stderr[-2000:]}")
    wall, cpu = found[0]
    return float(wall), float(cpu)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--tree", type=Path, default=HERE.parent)
    p.add_argument("--label", default="")
    p.add_argument("--out", type=Path, default=HERE.parent / "outputs" / "startup")
    p.add_argument("--json", type=Path, default=None, help="append one JSON line with every run here")
    p.add_argument("overrides", nargs="*")
    a = p.parse_args()
    times = []
    for k in range(a.runs):
        run_dir = a.out / f"{a.label or 'run'}-{int(time.time() * 1000)}-{k}"
        times.append(one(a.tree.resolve(), a.overrides, run_dir.resolve()))
        print(f"run {k + 1}: wall {times[-1][0]:.3f} s, CPU {times[-1][1]:.3f} s", flush=True)
    wall, cpu = statistics.median(t[0] for t in times), statistics.median(t[1] for t in times)
    print(f"{a.label or a.tree}: median wall {wall:.3f} s, median CPU {cpu:.3f} s over {a.runs} runs")
    if a.json:
        record = {
            "label": a.label,
            "tree": str(a.tree),
            "overrides": a.overrides,
            "runs": times,
            "wall": wall,
            "cpu": cpu,
        }
        with a.json.open("a") as f:
            f.write(json.dumps(record) + "\n")


if __name__ == "__main__":
    main()
