"""The GPU check in one command: the ``gpu``-marked tests, the device, and the GPU benchmarks, in one JSON.

    python benchmarks/gpu_check.py --json out.json [--data-root DIR] [--skip-tests] [--skip-benchmarks]

1. ``tests``: ``pytest -m gpu -n 0 -p no:cacheprovider`` in a subprocess; its JUnit XML is read
   into pass/fail/error/skip counts, the ids of failing tests and the skip reasons. Without CUDA
   every ``gpu`` test skips.
2. ``device``: Python, torch, Lightning and CUDA versions, whether CUDA is available, and each
   device's name and memory.
3. ``benchmarks``: :func:`run_benchmarks` (skipped, with its reason, without CUDA): FedAvg on
   MNIST ``mnistfc`` per round on CUDA and on the CPU, and Federated Zampling at the S1 shape
   (m/n = 32, d = 10) per round on the ``loop`` and ``vectorised`` backends of the same GPU, and
   :mod:`cohort_scaling` (S1, S2, 1,000 clients a round and CIFAR-10-shaped ``resnet18_gn``,
   fedlightning against a plain loop, sequential and ``vmap``), and :mod:`host_cost` (the
   vectorised backend's host time per client as the cohort grows from 100 to 1,000).

The JSON is written even when a part fails. The exit status is 1 when a test failed or errored
(or pytest could not run), else 0, so a machine without CUDA exits 0. Needs no ``fedlightning``
console script: runs go through :func:`fedlightning.run.run` in this process. MNIST is read from
``--data-root``, else ``$DATA_ROOT``, ``$FEDLIGHTNING_TEST_DATA`` or ``../shared/data``.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))


def run_gpu_tests(args: argparse.Namespace, junit: Path) -> dict[str, Any]:
    """Run ``pytest -m gpu`` in a subprocess and summarise its JUnit XML."""
    command = [sys.executable, "-m", "pytest", "-m", "gpu", "-n", "0", "-p", "no:cacheprovider", "-q", "-rA"]
    command += ["--continue-on-collection-errors", f"--junit-xml={junit}", *args.pytest_args]
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "WANDB_MODE": "disabled"}
    started = time.perf_counter()
    try:
        done = subprocess.run(
            command, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=args.test_timeout, check=False
        )
        returncode, output = done.returncode, done.stdout + done.stderr
    except subprocess.TimeoutExpired as exc:
        returncode, output = None, f"pytest timed out after {args.test_timeout} s\n{exc.stdout or ''}{exc.stderr or ''}"
    result: dict[str, Any] = {
        "command": " ".join(command[1:]),
        "returncode": returncode,
        "seconds": round(time.perf_counter() - started, 1),
        "output_tail": output[-4000:],
    }
    if not junit.is_file():
        result["error"] = "pytest wrote no JUnit XML"
        return result
    result.update(parse_junit(junit))
    return result


def parse_junit(path: Path) -> dict[str, Any]:
    """Counts, failing test ids and skip reasons of a JUnit XML report."""
    counts = Counter[str]()
    failing: list[str] = []
    skips = Counter[str]()
    for case in ET.parse(path).getroot().iter("testcase"):
        test_id = pytest_id(case.get("classname", ""), case.get("name", ""))
        outcome = next((child.tag for child in case if child.tag in ("failure", "error", "skipped")), "passed")
        counts[outcome] += 1
        if outcome in ("failure", "error"):
            failing.append(test_id)
        elif outcome == "skipped":
            skipped = case.find("skipped")
            skips[(skipped.get("message") if skipped is not None else None) or ""] += 1
    return {
        "passed": counts["passed"],
        "failed": counts["failure"],
        "errors": counts["error"],
        "skipped": counts["skipped"],
        "total": sum(counts.values()),
        "failing": failing,
        "all_skipped": bool(counts) and counts["skipped"] == sum(counts.values()),
        "skip_reasons": dict(skips.most_common()),
    }


def pytest_id(classname: str, name: str) -> str:
    """A JUnit test case as pytest names it: ``tests.test_gpu`` + ``test_x[a]`` -> ``tests/test_gpu.py::test_x[a]``."""
    parts = classname.split(".")
    for k, part in enumerate(parts):
        if part.startswith("test_"):
            return "::".join(["/".join(parts[: k + 1]) + ".py", *parts[k + 1 :], name])
    return f"{classname}::{name}"


def device_info() -> dict[str, Any]:
    """Versions, CUDA availability and each CUDA device's name and memory."""
    import lightning
    import torch

    info: dict[str, Any] = {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "torch": torch.__version__,
        "lightning": lightning.__version__,
        "torch_cuda": torch.version.cuda,
        "cuda": torch.cuda.is_available(),
        "devices": [],
    }
    if not info["cuda"]:
        return info
    info["cudnn"] = torch.backends.cudnn.version()
    for index in range(torch.cuda.device_count()):
        props = torch.cuda.get_device_properties(index)
        free, total = torch.cuda.mem_get_info(index)
        info["devices"].append(
            {
                "index": index,
                "name": torch.cuda.get_device_name(index),
                "capability": f"{props.major}.{props.minor}",
                "memory_total_gib": round(total / 2**30, 2),
                "memory_free_gib": round(free / 2**30, 2),
                "multiprocessors": props.multi_processor_count,
            }
        )
    return info


def data_root(args: argparse.Namespace) -> Path:
    """Where MNIST is looked for (``<root>/MNIST/raw``)."""
    for candidate in (args.data_root, os.environ.get("DATA_ROOT"), os.environ.get("FEDLIGHTNING_TEST_DATA")):
        if candidate:
            return Path(candidate).resolve()
    return (REPO_ROOT.parent / "shared" / "data").resolve()


def round_seconds(folder: Path) -> list[float]:
    """Each round's ``time/round_s`` (the engine's round time) from a run's ``csv/metrics.csv``."""
    with (folder / "csv" / "metrics.csv").open() as handle:
        return [float(row["time/round_s"]) for row in csv.DictReader(handle) if row.get("time/round_s")]


# ---------------------------------------------------------------- GPU benchmarks
# The hook for GPU throughput benchmarks: each adds its entry to the dictionary run_benchmarks returns.

RECORDED_KEYS = ("local_execution", "threads")  # recorded where present


def run_benchmarks(args: argparse.Namespace) -> dict[str, Any]:
    """GPU benchmarks: FedAvg on MNIST (``model=mnistfc``) on CUDA and on the CPU, median seconds per round.

    Each leg runs ``args.rounds`` rounds with the config's default local execution and one
    evaluation at the end; the seconds of a round are the engine's ``time/round_s``. Without CUDA
    or MNIST the benchmark is skipped with its reason.
    """
    import torch

    if not torch.cuda.is_available():
        return {"fedavg_mnistfc": {"skipped": "CUDA is not available"}}
    root = data_root(args)
    if not (root / "MNIST" / "raw").is_dir():
        return {"fedavg_mnistfc": {"skipped": f"MNIST not found at {root}/MNIST/raw (set --data-root or DATA_ROOT)"}}
    from fedlightning.run import run
    from tests.conftest import compose_config

    overrides = ["data=mnist", "model=mnistfc", f"data.root={root}", f"rounds={args.rounds}"]
    overrides += [f"eval_every={args.rounds}", "logger=csv"]
    legs: dict[str, Any] = {}
    for accelerator in ("gpu", "cpu"):
        cfg = compose_config([*overrides, f"trainer.accelerator={accelerator}"])
        folder = args.runs_dir / f"fedavg_mnistfc_{accelerator}"
        summary = run(cfg, folder)
        seconds = round_seconds(folder)
        legs[accelerator] = {
            "median_round_s": statistics.median(seconds),
            "round_s": seconds,
            "wall_s": summary["time/wall_s"],
            "test/acc": summary["test/acc"],
            "comm/uplink_bits_total": summary["comm/uplink_bits_total"],
            "config": {k: cfg[k] for k in RECORDED_KEYS if k in cfg},
            "torch_threads": summary.get("torch_threads"),
            "folder": str(folder),
        }
    gpu, cpu = legs["gpu"], legs["cpu"]
    return {
        "fedavg_mnistfc": {
            "overrides": overrides,
            **legs,
            "speedup_cpu_over_gpu": cpu["median_round_s"] / gpu["median_round_s"],
            "same_uplink_bits": gpu["comm/uplink_bits_total"] == cpu["comm/uplink_bits_total"],
        },
        "zampling_s1_loop_vs_vectorised": zampling_backends(args, root),
        "cohort_scaling": cohort_scaling(args, root),
        "host_cost": host_cost(args, root),
    }


def cohort_scaling(args: argparse.Namespace, root: Path) -> dict[str, Any]:
    """S1, S2, 1,000 clients a round and ``resnet18_gn`` on CUDA against a plain loop (``cohort_scaling.py``).

    Run in its own process; its JSON (every arm's seconds per round and their medians) is returned,
    with its Markdown table.
    """
    out, table = args.runs_dir / "cohort_scaling.json", args.runs_dir / "cohort_scaling.md"
    script = Path(__file__).with_name("cohort_scaling.py")
    command = [sys.executable, str(script), "--device", "cuda", "--rounds", str(max(args.rounds, 3)), "--repeats", "2"]
    command += ["--data-root", str(root), "--json", str(out), "--markdown", str(table)]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0 or not out.is_file():
        return {"error": f"exit {done.returncode}: {done.stderr[-2000:]}"}
    return {**json.loads(out.read_text()), "table": table.read_text()}


def host_cost(args: argparse.Namespace, root: Path) -> dict[str, Any]:
    """The vectorised backend's host time per client on CUDA, its maths negligible (``benchmarks/host_cost.py``).

    Run in its own process; its JSON (each arm's seconds a round at K = 100 and 1,000 and the slope) is returned.
    """
    out = args.runs_dir / "host_cost.json"
    script = Path(__file__).with_name("host_cost.py")
    command = [sys.executable, str(script), "--arms", "vectorised_host,vectorised", "--repeats", "2"]
    command += ["--data-root", str(root), "--json", str(out)]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0 or not out.is_file():
        return {"error": f"exit {done.returncode}: {done.stderr[-2000:]}"}
    return dict(json.loads(out.read_text()))


def zampling_backends(args: argparse.Namespace, root: Path) -> dict[str, Any]:
    """Federated Zampling at the S1 shape on CUDA, loop against vectorised (``benchmarks/zampling_vectorised.py``).

    Run in its own process; its JSON (medians, every round, ``loop_over_vectorised``) is returned.
    """
    out = args.runs_dir / "zampling_vectorised.json"
    script = Path(__file__).with_name("zampling_vectorised.py")
    command = [sys.executable, str(script), "--device", "cuda", "--rounds", str(args.rounds)]
    command += ["--data-root", str(root), "--json", str(out)]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0 or not out.is_file():
        return {"error": f"exit {done.returncode}: {done.stderr[-2000:]}"}
    return dict(json.loads(out.read_text()))


# ---------------------------------------------------------------- command


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, required=True, help="where the results go")
    parser.add_argument("--data-root", default=None, help="folder holding MNIST/raw (default: $DATA_ROOT, ...)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds per benchmark leg")
    parser.add_argument("--runs-dir", type=Path, default=None, help="run folders of the benchmarks (default: temp)")
    parser.add_argument("--test-timeout", type=float, default=3600.0, help="seconds before pytest is stopped")
    parser.add_argument("--skip-tests", action="store_true")
    parser.add_argument("--skip-benchmarks", action="store_true")
    parser.add_argument("--pytest-args", nargs=argparse.REMAINDER, default=[], help="passed on to pytest (last)")
    args = parser.parse_args(argv)
    args.json = args.json.resolve()
    args.runs_dir = (args.runs_dir or Path(tempfile.mkdtemp(prefix="gpu_check_"))).resolve()
    os.environ.setdefault("WANDB_MODE", "disabled")

    results: dict[str, Any] = {"started": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    if not args.skip_tests:
        with tempfile.TemporaryDirectory() as tmp:
            results["tests"] = run_gpu_tests(args, Path(tmp) / "junit.xml")
    device = device_info()
    results["device"] = device
    results["cuda"] = device["cuda"]
    if not args.skip_benchmarks:
        try:
            results["benchmarks"] = run_benchmarks(args)
        except Exception as exc:  # the tests' and device's results are still written
            results["benchmarks"] = {"error": f"{type(exc).__name__}: {exc}"}
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(results, indent=2) + "\n")
    tests = results.get("tests", {})
    failed = bool(tests) and (tests.get("returncode") not in (0, 5) or tests.get("failed") or tests.get("errors"))
    print(
        f"cuda={device['cuda']} tests: {tests.get('passed', '-')} passed, {tests.get('failed', '-')} failed, "
        f"{tests.get('errors', '-')} errors, {tests.get('skipped', '-')} skipped; results in {args.json}"
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
