"""Seed statistics for the JSON lines of ``benchmarks/distributed_sgd.py``: mean ± sd and paired differences.

A run is one (workload, operator, step size, density, validation size, master, seed); its last
record is its result. For each configuration the script prints the mean ± sample sd over seeds of
the final test accuracy (and validation accuracy, where held out) and of the uplink bits, and for
each requested pair ``a:b`` the paired differences ``acc(a) − acc(b)`` over the seeds both ran:
their mean, sd, the 95 % Student-t half-width and whether every seed has the same sign. A pair's
ordering "survives the seed noise" when the t-interval excludes 0.

    python benchmarks/distributed_sgd_seeds.py outputs/dsgd/mnist_seeds.jsonl \\
        --pairs natural:none top_k_ef:top_k induced:top_k_ef
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from scipy import stats

Config = tuple[str, str, float, float, int, str]


@dataclass(frozen=True)
class Paired:
    """Paired differences ``a_s − b_s`` over seeds ``s``."""

    seeds: tuple[int, ...]
    differences: tuple[float, ...]
    mean: float
    sd: float
    half_width_95: float
    same_sign: bool

    @property
    def survives(self) -> bool:
        """The 95 % t-interval of the mean difference excludes 0."""
        return abs(self.mean) > self.half_width_95


def paired(a: dict[int, float], b: dict[int, float]) -> Paired:
    """Paired comparison of two per-seed results on the seeds both have (at least two).

    >>> p = paired({0: 0.9, 1: 0.8, 2: 0.7}, {0: 0.8, 1: 0.8, 2: 0.6})
    >>> round(p.mean, 6), round(p.sd, 6), p.same_sign
    (0.066667, 0.057735, False)
    """
    seeds = tuple(sorted(set(a) & set(b)))
    if len(seeds) < 2:
        raise ValueError(f"a paired comparison needs two common seeds, got {seeds}")
    diffs = tuple(a[s] - b[s] for s in seeds)
    sd = statistics.stdev(diffs)
    half = float(stats.t.ppf(0.975, len(diffs) - 1)) * sd / math.sqrt(len(diffs))
    return Paired(
        seeds=seeds,
        differences=diffs,
        mean=statistics.fmean(diffs),
        sd=sd,
        half_width_95=half,
        same_sign=all(d > 0 for d in diffs) or all(d < 0 for d in diffs),
    )


def final_records(paths: list[Path], min_epoch: float) -> dict[Config, dict[int, dict[str, object]]]:
    """The last record of every run that reached ``min_epoch``, by configuration and seed (no ``seed``: 0)."""
    runs: dict[Config, dict[int, dict[str, object]]] = defaultdict(dict)
    for path in paths:
        for line in path.read_text().splitlines():
            r = json.loads(line)
            key: Config = (
                r["workload"],
                r["op"],
                float(r["lr"]),
                float(r["density"]),
                int(r.get("validation") or 0),
                str(r.get("master", "none")),
            )
            seed = int(r.get("seed", 0))
            if seed not in runs[key] or int(r["step"]) >= int(runs[key][seed]["step"]):  # type: ignore[call-overload]
                runs[key][seed] = r
    complete: dict[Config, dict[int, dict[str, object]]] = {}
    for key, by_seed in runs.items():
        done = {s: r for s, r in by_seed.items() if float(r.get("epoch", min_epoch)) >= min_epoch - 1e-9}  # type: ignore[arg-type]
        if done:
            complete[key] = done
    return complete


def mean_sd(values: list[float]) -> str:
    return f"{statistics.fmean(values):.4f} ± {statistics.stdev(values):.4f}" if len(values) > 1 else f"{values[0]:.4f}"


def bits(values: list[float]) -> str:
    return f"{statistics.fmean(values):.4g} ± {statistics.stdev(values):.2g}" if len(values) > 1 else f"{values[0]:.4g}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("inputs", nargs="+", type=Path)
    parser.add_argument("--pairs", nargs="*", default=[], help="a:b operator pairs, compared within each setting")
    parser.add_argument("--metric", default="test_acc", choices=["test_acc", "val_acc"])
    parser.add_argument("--min-epoch", type=float, default=1.0, help="runs that stopped earlier are left out")
    args = parser.parse_args()
    runs = final_records(args.inputs, args.min_epoch)
    print("| workload | operator | lr | density | validation | master | seeds | steps | test acc | val acc | up bits |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for key, by_seed in sorted(runs.items()):
        recs = [by_seed[s] for s in sorted(by_seed)]
        vals = [float(r["val_acc"]) for r in recs if r.get("val_acc") is not None]  # type: ignore[arg-type]
        print(
            f"| {' | '.join(str(k) for k in key)} | {','.join(str(s) for s in sorted(by_seed))} | "
            f"{','.join(str(r['step']) for r in recs)} | {mean_sd([float(r['test_acc']) for r in recs])} | "  # type: ignore[arg-type]
            f"{mean_sd(vals) if vals else '—'} | {bits([float(r['up_bits']) for r in recs])} |"  # type: ignore[arg-type]
        )
    print()
    print(
        f"| setting (workload, lr, density, validation, master) | pair a − b | seeds | {args.metric} differences | "
        "mean ± sd | 95 % t half-width | same sign | survives |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for pair in args.pairs:
        a, b = pair.split(":")
        for key, by_seed in sorted(runs.items()):
            if key[1] != a:
                continue
            other = runs.get((key[0], b, *key[2:]))
            if not other:
                continue
            setting = ", ".join(str(k) for k in (key[0], *key[2:]))
            if len(set(by_seed) & set(other)) < 2:
                print(
                    f"| {setting} | {a} − {b} | {','.join(map(str, sorted(set(by_seed) & set(other))))} | "
                    "fewer than two common seeds | — | — | — | — |"
                )
                continue
            p = paired(
                {s: float(r[args.metric]) for s, r in by_seed.items()},  # type: ignore[arg-type]
                {s: float(r[args.metric]) for s, r in other.items()},  # type: ignore[arg-type]
            )
            diffs = ", ".join(f"{d:+.4f}" for d in p.differences)
            print(
                f"| {setting} | {a} − {b} | {','.join(map(str, p.seeds))} | {diffs} | {p.mean:+.4f} ± {p.sd:.4f} | "
                f"{p.half_width_95:.4f} | {'yes' if p.same_sign else 'no'} | {'yes' if p.survives else 'no'} |"
            )


if __name__ == "__main__":
    main()
