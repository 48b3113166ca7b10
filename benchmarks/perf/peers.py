"""The systems of the suite: their virtual environments and the command that runs a workload.

Each peer is installed into its own virtual environment under the cache folder (default
``~/.cache/fedlightning-bench``) with its ordinary pip; a peer that cannot be installed is
skipped with a note. fedlightning runs from this checkout with the interpreter running the suite.
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from .workloads import Workload

SYSTEMS_DIR = Path(__file__).resolve().parent / "systems"
REPO = Path(__file__).resolve().parents[2]
TORCH = "torch==2.14.1"

#: Peer name -> pip requirements of its virtual environment.
PEER_REQUIREMENTS = {
    "plain": [TORCH, "numpy"],
    "pfl": [TORCH, "pfl==0.6.0"],
    "flwr": [TORCH, "flwr[simulation]==1.42.0"],
}


@dataclass(frozen=True)
class System:
    """One column of the comparison."""

    name: str
    venv: str | None  # key of PEER_REQUIREMENTS, None for fedlightning
    processes: int = 1


SYSTEMS = (
    System("fedlightning, 1 process", None, 1),
    System("fedlightning, 2 processes", None, 2),
    System("plain PyTorch loop, 1 process", "plain", 1),
    System("pfl-research 0.6, 1 process", "pfl", 1),
    System("pfl-research 0.6, torchrun 2 processes", "pfl", 2),
    System("Flower 1.42 simulation, num_cpus=1", "flwr", 1),
)


def select_systems(systems: tuple[System, ...], wanted: str) -> list[System]:
    """The systems whose name contains one of the ``;``-separated substrings in ``wanted`` (all if empty).

    Without a ``;`` the value is split on commas, as the suite's earlier commands were written;
    a name such as ``"fedlightning, 1 process"`` contains a comma, so it is selected with ``;``:

    >>> [s.name for s in select_systems(SYSTEMS, "fedlightning, 1 process;")]
    ['fedlightning, 1 process']
    >>> [s.name for s in select_systems(SYSTEMS, "plain,pfl")][:2]
    ['plain PyTorch loop, 1 process', 'pfl-research 0.6, 1 process']
    """
    separator = ";" if ";" in wanted else ","
    keys = [k.strip() for k in wanted.split(separator) if k.strip()]
    return [s for s in systems if not keys or any(k in s.name for k in keys)]


def ensure_venv(cache: Path, key: str, log: Path) -> tuple[Path | None, str]:
    """The venv's python, installing it on first use; ``(None, why)`` when it cannot be installed."""
    venv = cache / key
    python = venv / "bin" / "python"
    marker = venv / ".bench-installed"
    if marker.exists():
        return python, ""
    with log.open("a") as out:
        try:
            if not python.exists():
                subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, stdout=out, stderr=out)
            subprocess.run(
                [str(python), "-m", "pip", "install", *PEER_REQUIREMENTS[key]], check=True, stdout=out, stderr=out
            )
        except (subprocess.CalledProcessError, OSError) as exc:
            return None, f"pip install {' '.join(PEER_REQUIREMENTS[key])} failed ({exc}); see {log}"
    marker.write_text(" ".join(PEER_REQUIREMENTS[key]))
    return python, ""


def command(
    system: System, w: Workload, *, python: Path | None, root: str, run_dir: Path, port: int
) -> tuple[list[str], dict[str, str]] | None:
    """The command and extra environment that run ``w`` on ``system`` (None: not applicable)."""
    env = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}
    if system.venv is None:
        overrides = [
            *w.overrides,
            f"data.root={root}",
            f"rounds={w.rounds}",
            "eval_every=1",
            "checkpoint_every=0",
            "save_partition=false",
            "threads=1",
            "seed=0",
            "+callbacks.bench_clock._target_=benchmarks.perf.systems.fl_timer.BenchClock",
            f"hydra.run.dir={run_dir}",
        ]
        if system.processes > 1:
            overrides += ["trainer=ddp", f"trainer.devices={system.processes}"]
            env["MASTER_PORT"] = str(port)
        env["PYTHONPATH"] = os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)
        # -m (not -c): Lightning relaunches the same command line for the second process
        return [sys.executable, "-m", "fedlightning.cli", *overrides], env
    if not w.peers or python is None:
        return None
    args = [
        f"--root={root}",
        f"--rounds={w.rounds}",
        f"--clients={w.clients}",
        f"--per-client={w.per_client}",
        f"--per-round={w.per_round}",
        f"--batch={w.batch}",
        "--lr=0.05",
    ]
    if system.venv == "plain":
        return [str(python), str(SYSTEMS_DIR / "plain_loop.py"), *args], env
    if system.venv == "pfl":
        script = str(SYSTEMS_DIR / "pfl_peer.py")
        if system.processes == 1:
            return [str(python), script, *args], env
        torchrun = python.parent / "torchrun"
        return [str(torchrun), f"--nproc_per_node={system.processes}", f"--master-port={port}", script, *args], env
    if system.venv == "flwr":
        env |= {"PYTHONPATH": str(SYSTEMS_DIR), "FLWR_TELEMETRY_ENABLED": "0", "RAY_USAGE_STATS_ENABLED": "0"}
        return [str(python), str(SYSTEMS_DIR / "flower_peer.py"), *args], env
    raise ValueError(f"unknown peer {system.venv}")
