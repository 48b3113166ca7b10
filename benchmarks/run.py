"""The benchmark suite: fedlightning side by side with a plain loop, pfl-research and Flower.

    python benchmarks/run.py [--quick] [--json FILE] [--markdown FILE] [--repetitions 3]

Runs workloads S0, S1, S2, S3, S5, S7 (see ``benchmarks/perf/workloads.py``), interleaved:
repetition r runs every (workload, system) pair once, in an order shuffled per repetition, so
a slow phase of a shared machine hits every system alike. Before each run it waits (at most
``--quiet-timeout`` seconds) for the machine's load to fall to ``--max-foreign-load`` cores, and
it records the load of other processes during each run; medians are taken over the quiet runs
when there are any (the table says which). Peers are installed on first use into virtual
environments under ``--cache`` and skipped with a note when they cannot be installed. Not part
of the test suite.

The JSON (default ``benchmarks/results/performance.json``, overwritten by each campaign) holds
the medians, the command and date, and every run's record; each run's folder goes beside it in
``<json stem>_runs/`` (not tracked), and so does the Markdown table unless ``--markdown`` says
where. ``benchmarks/results/performance.md`` is written by hand from these tables.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.perf import measure, peers, report
from benchmarks.perf.workloads import MLP_MACS, Workload, workloads

DEFAULT_ROOT = "/work/shared/data"
DEFAULT_JSON = Path(__file__).resolve().parent / "results" / "performance.json"


def run_one(cmd: list[str], env: dict[str, str], w: Workload, *, timeout_s: float, log: Path) -> dict[str, Any]:
    """Launch one run, sample its process tree, parse its result line."""
    full_env = {**os.environ, **env, "BENCH_LAUNCH_T": repr(time.time())}
    with log.open("w") as out:
        proc = subprocess.Popen(cmd, env=full_env, stdout=subprocess.PIPE, stderr=out, cwd=peers.REPO)
        with measure.TreeMonitor(proc) as mon:
            try:
                stdout, _ = proc.communicate(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                proc.kill()
                stdout, _ = proc.communicate()
        out.write(stdout.decode(errors="replace"))
    s = mon.sample
    rec: dict[str, Any] = {
        "wall_s": s.wall_s,
        "cpu_s": s.cpu_s,
        "peak_pss_mb": s.peak_pss_mb,
        "peak_processes": s.peak_processes,
        "foreign_load": s.foreign_load,
        "returncode": proc.returncode,
        "error": None,
    }
    # another process of the tree may write into the same line: decode just the JSON object
    text = stdout.decode(errors="replace")
    lines = [ln.split("BENCH_RESULT ", 1)[1] for ln in text.splitlines() if "BENCH_RESULT " in ln]
    if proc.returncode != 0 or not lines:
        tail = log.read_text(errors="replace").strip().splitlines()[-1:] or ["no output"]
        rec["error"] = f"exit {proc.returncode}: {tail[0]}"
        rec.update(
            seconds_per_round=None, cpu_seconds_per_round=None, startup_s=None, first_round_s=None, test_acc=None
        )
        return rec
    res, _ = json.JSONDecoder().raw_decode(lines[-1])
    rounds = res["round_s"]
    steady = rounds[1:] or rounds  # round 1 carries warm-up (Ray's start for Flower)
    launch = float(full_env["BENCH_LAUNCH_T"])
    first_round_at = launch + (res["startup_s"] or 0.0)
    # CPU of the tree after start-up, per round (the sampled timeline, nearest point)
    before = [cpu for t, cpu in s.cpu_timeline if t <= first_round_at]
    cpu_at_start = before[-1] if before else 0.0
    rec.update(
        seconds_per_round=statistics.median(steady) if steady else None,
        round_s=rounds,
        first_round_s=rounds[0] if rounds else None,
        cpu_seconds_per_round=(s.cpu_s - cpu_at_start) / max(len(rounds), 1),
        startup_s=res["startup_s"],
        test_acc=res["test_acc"],
    )
    return rec


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="short runs (S1/S3/S5 on a labelled subset)")
    p.add_argument("--json", type=Path, default=DEFAULT_JSON, help="default: benchmarks/results/performance.json")
    p.add_argument("--markdown", type=Path, default=None, help="default: table.md in the JSON's runs folder")
    p.add_argument("--repetitions", type=int, default=3)
    p.add_argument("--root", default=DEFAULT_ROOT, help="folder holding MNIST/raw and golub/")
    p.add_argument("--cache", type=Path, default=Path.home() / ".cache" / "fedlightning-bench")
    p.add_argument("--workloads", default="S0,S1,S2,S3,S5,S7", help="comma-separated ids (S7 = all sizes)")
    p.add_argument(
        "--systems",
        default="",
        help="substrings of the system names to keep, separated by ';' (or by ',' when the value has no ';'; "
        "names such as 'fedlightning, 1 process' contain a comma, so select them with ';')",
    )
    p.add_argument("--max-foreign-load", type=float, default=0.3, help="cores; quieter runs count as quiet")
    p.add_argument("--quiet-timeout", type=float, default=None, help="seconds to wait for quiet before a run")
    p.add_argument("--run-timeout", type=float, default=None, help="seconds before a run is killed")
    p.add_argument(
        "--stop-after", type=float, default=None, help="start no new run after this many seconds (then summarise)"
    )
    a = p.parse_args()
    if a.repetitions < 3:
        p.error("--repetitions must be at least 3 (medians of fewer runs are not reported)")
    quiet_timeout = a.quiet_timeout if a.quiet_timeout is not None else (5.0 if a.quick else 60.0)
    run_timeout = a.run_timeout if a.run_timeout is not None else (240.0 if a.quick else 1800.0)
    out_dir = a.json.resolve().parent / (a.json.stem + "_runs")
    out_dir.mkdir(parents=True, exist_ok=True)
    a.cache.mkdir(parents=True, exist_ok=True)
    wanted = {x.strip() for x in a.workloads.split(",") if x.strip()}
    chosen = [w for w in workloads(a.quick) if w.id in wanted or w.id.split("-")[0] in wanted]
    systems = peers.select_systems(peers.SYSTEMS, a.systems)
    if not systems:
        p.error(f"--systems {a.systems!r} matches none of: " + "; ".join(s.name for s in peers.SYSTEMS))
    print("[bench] systems: " + "; ".join(s.name for s in systems), flush=True)

    pythons: dict[str, Path | None] = {}
    skipped: dict[str, str] = {}
    for s in systems:
        if s.venv and s.venv not in pythons:
            print(f"[bench] preparing the {s.venv} environment ...", flush=True)
            pythons[s.venv], why = peers.ensure_venv(a.cache, s.venv, out_dir / f"install-{s.venv}.log")
            if why:
                skipped[s.name] = why
    for s in systems:
        if s.venv and pythons.get(s.venv) is None:
            skipped.setdefault(s.name, "its environment could not be installed")

    rate = measure.matmul_gflops(32, 784, 300)
    cores = 2
    floors = {w.id: w.flops_per_round / (rate * 1e9 * cores) for w in chosen if w.flops_per_round}
    pairs = [
        (w, s)
        for w in chosen
        for s in systems
        if s.name not in skipped and (s.venv is None or w.peers) and not (s.processes > 1 and w.id.startswith("S7"))
    ]
    runs: list[dict[str, Any]] = []
    started = time.monotonic()
    port = 29700
    for rep in range(1, a.repetitions + 1):
        order = pairs[:]
        random.Random(rep).shuffle(order)
        for w, s in order:
            if a.stop_after is not None and time.monotonic() - started > a.stop_after:
                print(f"[bench] --stop-after {a.stop_after:.0f} s reached: no further runs", flush=True)
                break
            port += 1
            python = pythons.get(s.venv) if s.venv else None
            tag = f"{w.id}-{s.name.split(',')[0].split(' ')[0]}-{s.processes}p-rep{rep}"
            built = peers.command(s, w, python=python, root=a.root, run_dir=out_dir / "fl" / tag, port=port)
            if built is None:
                continue
            cmd, env = built
            quiet, load_before = measure.wait_for_quiet(
                max_load=a.max_foreign_load, timeout_s=quiet_timeout, probe_s=1.0 if a.quick else 2.0
            )
            rec = run_one(cmd, env, w, timeout_s=run_timeout, log=out_dir / f"{tag}.log")
            rec.update(workload=w.id, system=s.name, repetition=rep, load_before=load_before, quiet_before=quiet)
            runs.append(rec)
            print(
                f"[bench] {time.monotonic() - started:7.1f}s rep {rep} {w.id:7s} {s.name:42s} "
                f"s/round={rec['seconds_per_round']} start-up={rec['startup_s']} acc={rec['test_acc']} "
                f"pss={rec['peak_pss_mb']:.0f}MB load={rec['foreign_load']:.2f} {rec['error'] or ''}",
                flush=True,
            )
            a.json.write_text(json.dumps({"partial": True, "runs": runs}, indent=1))

    summary = report.summarise(runs, floors=floors, max_foreign_load=a.max_foreign_load)
    meta = {
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "date_utc": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "quick": a.quick,
        "repetitions": a.repetitions,
        "host": platform.node(),
        "cores": cores,
        "cpu_count": os.cpu_count(),
        "matmul_gflops": rate,
        "mlp_macs_per_sample": MLP_MACS,
        "max_foreign_load": a.max_foreign_load,
        "titles": {w.id: w.title for w in chosen},
        "subsets": {w.id: w.subset for w in chosen if w.subset},
        "notes": {w.id: w.notes for w in chosen if w.notes},
        "skipped": skipped,
        "suite_wall_s": time.monotonic() - started,
        "stopped_early": a.stop_after is not None and time.monotonic() - started > a.stop_after,
    }
    a.json.write_text(json.dumps({**summary, "meta": meta, "runs": runs}, indent=1))
    md = a.markdown or out_dir / "table.md"
    md.write_text(report.markdown(summary, meta))
    print(f"[bench] wrote {a.json} and {md} in {meta['suite_wall_s']:.0f} s", flush=True)


if __name__ == "__main__":
    main()
