"""Shared pieces of the E-FLoPS benchmarks (``golub_comparison.py``, ``eflops_synthetic.py``).

* :func:`federated_run`: one in-process federated run from Hydra overrides (summary and the
  selected input features of the evaluated sparse model; ``{"diverged": True, ...}`` for a run
  the engine's divergence guard stopped); :func:`run_all` runs many of them in worker processes.
* :func:`split_tensors`: the exact train / validation / test tensors a run with the same
  overrides sees, for the centralised references.
* :func:`tune`: the tuning protocol shared by every method: each grid point runs on the tuning
  seeds with a validation split held out of the training data, and the point of best mean
  validation score wins (ties: lower validation loss, then the earlier point); the test set is
  never read. A point with a diverged tuning run is ineligible, and so, with a target density ρ
  (E-FLoPS), is a point whose achieved gate density D misses ρ by more than 10% on any tuning
  seed (:func:`density_eligible`, :func:`select_grid_point`); when no point is eligible,
  :class:`NoEligibleSettingError` stops the benchmark instead of picking one.
* :func:`lasso_reference` and :func:`iht_reference`: the centralised references (scikit-learn
  L1 with the penalty chosen by 5-fold cross-validation on the training split; IHT at the
  federated budget m).
"""

from __future__ import annotations

import json
import logging
import multiprocessing
import sys
import tempfile
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate
from omegaconf import DictConfig

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # this checkout's fedlightning, not another installed copy

from fedlightning.federated.divergence import DivergenceError  # noqa: E402
from fedlightning.methods.fediht import iterative_hard_thresholding  # noqa: E402
from fedlightning.run import run  # noqa: E402

QUIET = [
    "logger=none",
    "trainer.enable_progress_bar=false",
    "checkpoint_every=0",
    "save_partition=false",
    "eval_every=1000",
    "threads=1",
]


def compose_cfg(overrides: Sequence[str]) -> DictConfig:
    """The composed ``train`` config for ``overrides`` (plus the quiet defaults)."""
    with initialize_config_dir(config_dir=str(REPO / "configs"), version_base="1.3"):
        return compose(config_name="train", overrides=[*QUIET, *overrides])


CACHE = REPO / "outputs" / "benchmark_cache"
EFLOPS_CODE_VERSION = 2
"""Bumped when E-FLoPS' training changes, so cached E-FLoPS runs of older code are not reused
(1: off-support gates resumed from a per-tensor mean; 2: ``off_support_gates="closed"``)."""


def federated_run(overrides: Sequence[str]) -> dict[str, Any]:
    """Summary of one run, with ``"features"``: the selected input features (may be empty).

    A run that the engine's divergence guard stops returns ``{"diverged": True, "error": ...}``
    (no metrics) instead of ending the benchmark. Summaries are cached under
    ``outputs/benchmark_cache`` (git-ignored), keyed by the overrides, so an interrupted benchmark
    resumes where it stopped (clear the folder after a code change).
    """
    import hashlib

    salt = [f"eflops-code={EFLOPS_CODE_VERSION}"] if "method=eflops" in overrides else []
    key = hashlib.sha1("\n".join([*salt, *overrides]).encode()).hexdigest()
    cached = CACHE / f"{key}.json"
    if cached.exists():
        return dict(json.loads(cached.read_text()))
    cfg = compose_cfg(overrides)
    with tempfile.TemporaryDirectory() as folder:
        try:
            summary = dict(run(cfg, folder))
        except DivergenceError as exc:
            summary = {"diverged": True, "error": str(exc)}
        path = Path(folder) / "selected_features.json"
        summary["features"] = json.loads(path.read_text())["features"] if path.exists() else []
    CACHE.mkdir(parents=True, exist_ok=True)
    cached.write_text(json.dumps({k: v for k, v in summary.items() if _plain(v)}))
    return summary


def _quiet_worker() -> None:
    torch.set_num_threads(1)
    logging.disable(logging.WARNING)


def _cache_run(overrides: list[str]) -> None:
    federated_run(overrides)


def run_all(runs: Sequence[Sequence[str]], jobs: int) -> None:
    """Runs (and caches) every override list, in ``jobs`` worker processes of one torch thread each.

    Results are read back with :func:`federated_run`, which then hits the cache; with ``jobs <= 1``
    the runs happen in this process, in order.
    """
    todo = [list(r) for r in dict.fromkeys(tuple(r) for r in runs)]
    if jobs <= 1:
        for overrides in todo:
            federated_run(overrides)
        return
    spawn = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=jobs, mp_context=spawn, initializer=_quiet_worker) as pool:
        for future in [pool.submit(_cache_run, overrides) for overrides in todo]:
            future.result()


def merge_overrides(*groups: Sequence[str]) -> list[str]:
    """The override lists joined, a later ``key=value`` replacing an earlier one of the same key.

    >>> merge_overrides(["a=1", "method.t=0.001"], ["method.t=0", "b=2"])
    ['a=1', 'method.t=0', 'b=2']
    """
    merged: dict[str, str] = {}
    for group in groups:
        for item in group:
            key = item.split("=", 1)[0]
            merged.pop(key, None)
            merged[key] = item
    return list(merged.values())


def _plain(value: Any) -> bool:
    try:
        json.dumps(value)
    except TypeError:
        return False
    return True


def split_tensors(overrides: Sequence[str]) -> dict[str, Any]:
    """``{"train": (x, y), "val": (x, y) | None, "test": (x, y), "datamodule": dm}`` of a run's data."""
    cfg = compose_cfg(overrides)
    partition = instantiate(cfg.partition, _partial_=True)()
    dm = instantiate(cfg.data, _partial_=True)(partition=partition, seed=int(cfg.seed))
    dm.prepare_data()
    dm.setup("fit")
    parts = [dm.client_tensors(c) for c in range(dm.num_clients)]
    train = (torch.cat([p[0] for p in parts]).numpy(), torch.cat([p[1] for p in parts]).numpy())

    def collect(loader: Any) -> tuple[np.ndarray, np.ndarray]:
        xs, ys = zip(*[(x, y) for x, y in loader], strict=True)
        return torch.cat(xs).numpy(), torch.cat(ys).numpy()

    val = collect(dm.val_dataloader()) if dm.val_fraction > 0 else None
    return {"train": train, "val": val, "test": collect(dm.test_dataloader()), "datamodule": dm}


def score(task: str, coef: np.ndarray, x: np.ndarray, y: np.ndarray) -> float:
    """Accuracy ([w·x + b > 0] against y) or R² of the linear predictor ``coef = [w, b]``."""
    pred = x.reshape(len(x), -1) @ coef[:-1] + coef[-1]
    if task == "classification":
        return float(np.mean((pred > 0).astype(int) == y))
    return float(1.0 - np.sum((y - pred) ** 2) / np.sum((y - y.mean()) ** 2))


def lasso_reference(task: str, x: np.ndarray, y: np.ndarray, seed: int) -> np.ndarray:
    """[w, b] of L1-logistic regression / the Lasso, the penalty chosen by 5-fold CV on (x, y)."""
    from sklearn.linear_model import LassoCV, LogisticRegressionCV

    x2 = x.reshape(len(x), -1)
    if task == "classification":
        clf = LogisticRegressionCV(
            Cs=10, cv=5, penalty="l1", solver="liblinear", scoring="accuracy", max_iter=2000, random_state=seed
        )
        clf.fit(x2, y)
        return np.concatenate([clf.coef_.reshape(-1), clf.intercept_.reshape(-1)])
    reg = LassoCV(cv=5, random_state=seed, max_iter=5000).fit(x2, y)
    return np.concatenate([reg.coef_.reshape(-1), [reg.intercept_]])


def iht_reference(task: str, x: np.ndarray, y: np.ndarray, m: int) -> np.ndarray:
    """[w, b] of centralised IHT at the federated budget m."""
    loss: Literal["logistic", "squared"] = "logistic" if task == "classification" else "squared"
    return iterative_hard_thresholding(x.reshape(len(x), -1), y.astype(np.float64), m=m, loss=loss)


DENSITY_TOLERANCE = 0.1
"""A tuning point is eligible when every tuning run's achieved density D lies in ρ (1 ± 0.1)."""


def density_eligible(densities: Sequence[float], rho: float, tolerance: float = DENSITY_TOLERANCE) -> bool:
    """Whether every achieved density lies within ``tolerance`` ρ of ρ (a NaN or no run: not eligible).

    >>> density_eligible([0.0186, 0.0192], 0.02), density_eligible([0.0186, 0.0171], 0.02)
    (True, False)
    """
    values = [float(d) for d in densities]
    return bool(values) and all(abs(d - rho) <= tolerance * rho + 1e-12 for d in values)


def select_grid_point(scores: Sequence[float], losses: Sequence[float], eligible: Sequence[bool]) -> int | None:
    """Index of the eligible point of best score, ties to the lower loss (NaN: worst), then the
    earlier point; ``None`` when no point is eligible.

    >>> select_grid_point([0.12, 0.03, 0.03], [0.1, 0.5, 0.4], [False, True, True])
    2
    >>> select_grid_point([0.12], [0.1], [False]) is None
    True
    """
    candidates = [i for i, ok in enumerate(eligible) if ok]
    if not candidates:
        return None
    return max(candidates, key=lambda i: (scores[i], -np.nan_to_num(losses[i], nan=np.inf), -i))


class NoEligibleSettingError(RuntimeError):
    """No grid point met the density rule: the benchmark stops rather than pick one silently."""


@dataclass
class TuningPoint:
    """One grid point: its overrides, mean validation score and loss, each tuning run's D, eligibility,
    and how many of its tuning runs diverged."""

    overrides: list[str]
    score: float
    loss: float
    densities: list[float]
    eligible: bool
    diverged: int = 0


def tune(
    grid: Sequence[Sequence[str]],
    base: Sequence[str],
    seeds: Sequence[int],
    metric: str,
    *,
    rho: float | None = None,
) -> tuple[list[str], list[TuningPoint]]:
    """The grid point of best mean validation ``metric`` over ``seeds``, and every point's record.

    Ties on the metric go to the lower mean validation loss, then to the earlier grid point.
    A point with a diverged tuning run is not eligible. With ``rho`` (a method with a learned
    density), only points whose expected gate density ``model/expected_density`` is within 10% of
    ``rho`` on every tuning seed are eligible.

    Raises:
        NoEligibleSettingError: when no grid point is eligible (its message holds the table).
    """
    table: list[TuningPoint] = []
    for point in grid:
        runs = [federated_run([*base, *point, f"seed={s}"]) for s in seeds]
        diverged = sum(bool(r.get("diverged")) for r in runs)
        densities = [float(r.get("model/expected_density", np.nan)) for r in runs]
        table.append(
            TuningPoint(
                overrides=list(point),
                score=float(np.mean([float(r.get(metric, -np.inf)) for r in runs])),
                loss=float(np.mean([float(r.get("val/loss", np.nan)) for r in runs])),
                densities=densities,
                eligible=not diverged and (rho is None or density_eligible(densities, rho)),
                diverged=diverged,
            )
        )
    best = select_grid_point([p.score for p in table], [p.loss for p in table], [p.eligible for p in table])
    if best is None:
        rule = "" if rho is None else f" and reaches an expected density within 10% of rho = {rho:g}"
        raise NoEligibleSettingError(
            f"no grid point trains without diverging{rule} on every tuning seed "
            "(ineligible: " + "; ".join(describe_point(p) for p in table) + "); widen the grid."
        )
    return table[best].overrides, table


def describe_point(point: TuningPoint, skip: int = 1) -> str:
    """One tuning-table entry: the overrides and score, with each run's D and "ineligible" where that applies."""
    text = f"`{' '.join(point.overrides[skip:])}` {point.score:.3f}"
    if point.diverged:
        return text + f" (diverged in {point.diverged} tuning run(s); ineligible)"
    if any(np.isfinite(point.densities)):
        flag = "" if point.eligible else "; ineligible"
        text += " (D " + ", ".join(f"{d:.4f}" for d in point.densities) + flag + ")"
    return text


def jaccard_stability(sets: Sequence[set[str]]) -> float:
    """Mean pairwise Jaccard index |A ∩ B| / |A ∪ B| of the selected sets (1 for identical sets).

    >>> round(jaccard_stability([{"a", "b"}, {"b", "c"}, {"a", "b"}]), 4)
    0.5556
    """
    values = []
    for i in range(len(sets)):
        for j in range(i + 1, len(sets)):
            union = sets[i] | sets[j]
            values.append(len(sets[i] & sets[j]) / len(union) if union else 1.0)
    return float(np.mean(values)) if values else float("nan")
