"""What logging a round costs: the engine's one-call round row against one ``self.log`` per value.

Workload S0 of the suite (Golub, logistic regression, 6 clients, full batch: a round is almost
all overhead), run through :func:`fedlightning.run.run` as the ``fedlightning`` command composes
it, with its loggers and callbacks. Arms: ``row`` (the engine as it is:
:func:`fedlightning.federated.round_row.log_round_row`) and ``per-value`` (the same run with
that function replaced by one ``LightningModule.log(name, value, on_step=True)`` per value,
which is how the engine logged a round before). Round time is from one round's start to the
next's, so evaluation and logging are included; the first round is not counted.

    python benchmarks/round_row.py --data-root ../shared/data --rounds 100 --repeats 3
    python benchmarks/round_row.py --data-root ../shared/data --workload S2 --rounds 4 --repeats 3

The arms run in turn, repetition after repetition, so machine load hits them alike.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from collections.abc import Collection, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import lightning as L
import torch
from hydra import compose, initialize_config_dir

sys.path.insert(0, str(Path(__file__).resolve().parent))

from lean_round import _Timer
from perf.workloads import workloads

import fedlightning.federated.module as engine
from fedlightning.federated.round_row import PROGRESS_BAR_NAMES, round_row_values
from fedlightning.run import run


def log_per_value(
    trainer: L.Trainer, round_idx: int, row: Mapping[str, Any], *, prog_bar: Collection[str] = PROGRESS_BAR_NAMES
) -> None:
    """The engine's former round logging: one ``self.log`` per value."""
    module = trainer.lightning_module
    for name, value in round_row_values(row).items():
        module.log(
            name, torch.tensor(value, dtype=torch.float64), on_step=True, on_epoch=False, prog_bar=name in prog_bar
        )


@contextmanager
def arm(name: str) -> Iterator[None]:
    original = engine.log_round_row
    if name == "per-value":
        engine.log_round_row = log_per_value  # type: ignore[assignment]
    try:
        yield
    finally:
        engine.log_round_row = original


def round_times(overrides: list[str]) -> list[tuple[float, float]]:
    with initialize_config_dir(config_dir=str(Path(__file__).resolve().parents[1] / "configs"), version_base="1.3"):
        cfg = compose(
            config_name="train", overrides=[*overrides, f"+callbacks.timer._target_={_Timer.__module__}._Timer"]
        )
    with tempfile.TemporaryDirectory() as folder:
        run(cfg, folder)
    assert _Timer.latest is not None
    return _Timer.latest.round_times()[1:]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-root", required=True)
    parser.add_argument("--workload", default="S0", help="a workload id of benchmarks/perf/workloads.py")
    parser.add_argument("--rounds", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(1)
    (workload,) = [w for w in workloads(quick=False) if w.id == args.workload]
    overrides = [
        *workload.overrides,
        f"data.root={args.data_root}",
        f"rounds={args.rounds + 1}",
        "eval_every=1",
        "threads=1",
        "logger=csv",
        "trainer.enable_progress_bar=false",
    ]
    arms = ("row", "per-value")
    times: dict[str, list[tuple[float, float]]] = {name: [] for name in arms}
    for _ in range(args.repeats):
        for name in arms:
            with arm(name):
                times[name] += round_times(overrides)
    for k, what in ((0, "wall"), (1, "CPU")):
        base = statistics.median(t[k] for t in times["per-value"])
        for name in arms:
            m = statistics.median(t[k] for t in times[name])
            print(
                f"{args.workload} {what}: {name} round median {m * 1e3:.2f} ms over {len(times[name])} rounds; "
                f"ratio to per-value {m / base:.3f}"
            )


if __name__ == "__main__":
    main()
