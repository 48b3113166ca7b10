"""The suite's JSON and Markdown table from the per-run records."""

from __future__ import annotations

import statistics
from typing import Any

FEDLIGHTNING_1 = "fedlightning, 1 process"
FEDLIGHTNING_2 = "fedlightning, 2 processes"


def _median(values: list[float]) -> float | None:
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def summarise(runs: list[dict[str, Any]], *, floors: dict[str, float], max_foreign_load: float) -> dict[str, Any]:
    """Per workload and system: medians over the repetitions (quiet ones when there are any).

    ``speedup[peer]`` is the peer's s/round over fedlightning's with the same number of processes
    (2 processes against pfl with 2, 1 process otherwise); ``efficiency`` is floor / s/round.
    """
    out: dict[str, Any] = {}
    for wid in dict.fromkeys(r["workload"] for r in runs):
        systems: dict[str, Any] = {}
        for name in dict.fromkeys(r["system"] for r in runs if r["workload"] == wid):
            reps = [r for r in runs if r["workload"] == wid and r["system"] == name]
            ok = [r for r in reps if r.get("error") is None]
            quiet = [r for r in ok if r["foreign_load"] <= max_foreign_load]
            used = quiet or ok
            entry: dict[str, Any] = {
                "repetitions": len(reps),
                "failed": len(reps) - len(ok),
                "quiet_repetitions": len(quiet),
                "medians_over": "quiet runs" if quiet else "all runs (none was quiet)",
                "seconds_per_round": _median([r["seconds_per_round"] for r in used]),
                "cpu_seconds_per_round": _median([r["cpu_seconds_per_round"] for r in used]),
                "startup_s": _median([r["startup_s"] for r in used]),
                "first_round_s": _median([r["first_round_s"] for r in used]),
                "total_wall_s": _median([r["wall_s"] for r in used]),
                "peak_pss_mb": _median([r["peak_pss_mb"] for r in used]),
                "peak_processes": max((r["peak_processes"] for r in used), default=None),
                "test_acc": _median([r["test_acc"] for r in used]),
                "foreign_load_cores": _median([r["foreign_load"] for r in reps]),
                "errors": sorted({r["error"] for r in reps if r.get("error")}),
            }
            floor = floors.get(wid)
            spr = entry["seconds_per_round"]
            entry["efficiency"] = floor / spr if floor and spr else None
            systems[name] = entry
        speedup: dict[str, float] = {}
        for name, entry in systems.items():
            if name.startswith("fedlightning") or entry["seconds_per_round"] is None:
                continue
            ours = systems.get(FEDLIGHTNING_2 if "2 processes" in name else FEDLIGHTNING_1, {})
            if ours.get("seconds_per_round"):
                speedup[name] = entry["seconds_per_round"] / ours["seconds_per_round"]
        accs = [e["test_acc"] for e in systems.values() if e["test_acc"] is not None]
        out[wid] = {
            "systems": systems,
            "speedup": speedup,
            "efficiency": {n: e["efficiency"] for n, e in systems.items()},
            "compute_floor_s": floors.get(wid),
            "accuracy_spread_points": 100 * (max(accs) - min(accs)) if len(accs) > 1 else None,
        }
    return out


def _f(v: float | None, fmt: str = "{:.3f}") -> str:
    return "—" if v is None else fmt.format(v)


def markdown(summary: dict[str, Any], meta: dict[str, Any]) -> str:
    """One table per workload plus the gate and the load notes."""
    lines = [f"Compute floor: float32 matmul {meta['matmul_gflops']:.1f} GFLOP/s per core × {meta['cores']} cores."]
    for wid, w in summary.items():
        lines += ["", f"### {wid}: {meta['titles'].get(wid, '')}"]
        if meta["subsets"].get(wid):
            lines.append(f"Data: {meta['subsets'][wid]}.")
        floor = w["compute_floor_s"]
        lines.append(f"Compute floor {_f(floor)} s/round." if floor else "No compute floor (not an MLP workload).")
        lines += [
            "",
            "| system | s/round | CPU s/round | start-up s | first round s | total wall s | peak PSS MB "
            "| processes | test acc | efficiency | our speedup | foreign load (cores) | runs (quiet) |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for name, e in w["systems"].items():
            sp = w["speedup"].get(name)
            cells = [
                name,
                _f(e["seconds_per_round"]),
                _f(e["cpu_seconds_per_round"]),
                _f(e["startup_s"], "{:.2f}"),
                _f(e["first_round_s"], "{:.2f}"),
                _f(e["total_wall_s"], "{:.1f}"),
                _f(e["peak_pss_mb"], "{:.0f}"),
                str(e["peak_processes"] or "—"),
                _f(e["test_acc"], "{:.4f}"),
                _f(e["efficiency"], "{:.2f}"),
                _f(sp, "{:.2f}×"),
                _f(e["foreign_load_cores"], "{:.2f}"),
                f"{e['repetitions'] - e['failed']} ({e['quiet_repetitions']})",
            ]
            lines.append("| " + " | ".join(cells) + " |")
            for err in e["errors"]:
                lines.append(f"|  ↳ {name} failed: {err[:200]} |||||||||||||")
        if w["accuracy_spread_points"] is not None:
            lines.append(f"\nAccuracy spread across systems: {w['accuracy_spread_points']:.2f} points.")
    if meta.get("skipped"):
        lines += ["", "Skipped systems:"] + [f"- {n}: {why}" for n, why in meta["skipped"].items()]
    return "\n".join(lines) + "\n"
