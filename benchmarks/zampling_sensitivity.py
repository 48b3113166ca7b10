"""Experiment 4 of arXiv 2503.14246: parameter sensitivity inside the τ-hypercube C_τ.

Trains Local Zampling twice from the ``zampling_sensitivity`` experiment config (small_mlp,
m/n = 1, d = 10): by sampling (``method.sampling=true``) and regularly on the expected
network w = Q·p (``method.sampling=false``). At test time each run perturbs its final p
``reports.zampling_evaluation.sensitivity_perturbations`` times inside C_τ for every τ (see
:func:`fedlightning.callbacks.zampling_sensitivity.perturb_in_hypercube`) and logs
``test/sensitivity/<τ>/*``; this script prints the paper's table from the two summaries
("Regular": the regular run's expected network; "Sampled": the sampled run's mean of
``sensitivity_samples`` sampled networks; ± is the std over the perturbations).

    python benchmarks/zampling_sensitivity.py --data-root ../shared/data --seed 0
    python benchmarks/zampling_sensitivity.py --data-root ../shared/data --quick
    python benchmarks/zampling_sensitivity.py --data-root ../shared/data \
        reports.zampling_evaluation.sensitivity_region=complement
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path
from typing import Any

import torch
from hydra import compose, initialize_config_dir

from fedlightning.run import run

CONFIG_DIR = Path(__file__).resolve().parents[1] / "configs"


def train(name: str, data_root: str, seed: int, sampling: bool, extra: list[str], out: Path) -> dict[str, Any]:
    """One run of experiment ``name`` with ``method.sampling=sampling``; returns its summary."""
    overrides = [
        f"+experiment={name}",
        f"data.root={data_root}",
        f"seed={seed}",
        f"method.sampling={str(sampling).lower()}",
        "logger=none",
        "trainer.enable_progress_bar=false",
        "save_partition=false",
        *extra,
    ]
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        cfg = compose(config_name="train", overrides=overrides)
    return run(cfg, out / ("sampled" if sampling else "regular"))


def table(regular: dict[str, Any], sampled: dict[str, Any]) -> str:
    """The paper's Table "hypercube_sensitivity" (accuracy in %, deviation in pp per unit ‖ε‖)."""
    taus = sorted({float(k.split("/")[2]) for k in sampled if k.startswith("test/sensitivity/") and k.count("/") == 3})

    def cell(s: dict[str, Any], tau: float, key: str, scale: float = 1.0) -> str:
        mean, std = s[f"test/sensitivity/{tau:g}/{key}"], s[f"test/sensitivity/{tau:g}/{key}_std"]
        return f"{scale * mean:.4g} ± {scale * std:.2g}"

    lines = [
        f"Unperturbed: regular expected {100 * regular['test/sensitivity/reference_acc_expected']:.2f}%, "
        f"sampled mean {100 * sampled['test/sensitivity/reference_acc_sampled']:.2f}%",
        "",
        "| τ | perturbed share (reg / samp) | accuracy % regular | accuracy % sampled | sensitivity regular"
        " | sensitivity sampled | deviation regular | deviation sampled | deviation per ‖ε‖ of the full draw"
        " (reg / samp) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for tau in taus:
        share = (
            f"{regular[f'test/sensitivity/{tau:g}/perturbed_fraction']:.3f} / "
            f"{sampled[f'test/sensitivity/{tau:g}/perturbed_fraction']:.3f}"
        )
        lines.append(
            f"| {tau:g} | {share} | {cell(regular, tau, 'acc_expected', 100)}"
            f" | {cell(sampled, tau, 'acc_sampled', 100)}"
            f" | {cell(regular, tau, 'sensitivity_expected')} | {cell(sampled, tau, 'sensitivity_sampled')}"
            f" | {cell(regular, tau, 'deviation_expected')} | {cell(sampled, tau, 'deviation_sampled')}"
            f" | {cell(regular, tau, 'deviation_full_expected')} / {cell(sampled, tau, 'deviation_full_sampled')} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-root", required=True)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true", help="use zampling_sensitivity_quick")
    parser.add_argument("--out", default=None, help="folder for the two runs (default: a temporary one)")
    parser.add_argument("overrides", nargs="*", help="extra Hydra overrides for both runs")
    args = parser.parse_args()
    torch.set_num_threads(1)
    name = "zampling_sensitivity_quick" if args.quick else "zampling_sensitivity"
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(args.out or tmp)
        runs = {s: train(name, args.data_root, args.seed, s, args.overrides, out) for s in (False, True)}
        keys = ("test/acc", "test/acc_sampled_mean")
        print(json.dumps({("sampled" if s else "regular"): {k: r[k] for k in keys} for s, r in runs.items()}))
        print(table(runs[False], runs[True]))


if __name__ == "__main__":
    main()
