"""What logging a round costs: the engine's one-call round row against one ``self.log`` per value.

Workload S0 of the suite (Golub, logistic regression, 6 clients, full batch: a round is almost
all overhead), run through :func:`fedlightning.run.run` as the ``fedlightning`` command composes
it, with its loggers and callbacks. Arms: ``row`` (the engine as it is:
:func:`fedlightning.federated.round_row.log_round_row`) and ``per-value`` (the same run with
that function replaced by one ``LightningModule.log(name, value, on_step=True)`` per value,
which is how the engine logged a round before). Round time is from one round's start to the
next's, so evaluation and logging are included; the first round is not counted.

    python benchmarks/round_row.py --data-root ../shared/data --rounds 100 --repeats 3
    python benchmarks/round_row.py --data-root ../shared/data --workload S2 --rounds 6 --repeats 3
    python benchmarks/round_row.py --bare   # Lightning alone: a step that only logs 20 values

``--bare`` times a bare ``Trainer`` whose ``training_step`` does nothing but log 20 floats
(``self.log`` one by one, ``self.log_dict``, or one direct logger call), against a step that
logs nothing: CPU ms per step, 300 steps each.

The arms run in turn, repetition after repetition, so machine load hits them alike.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Collection, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import lightning as L
import torch
from hydra import compose, initialize_config_dir

sys.path.insert(0, str(Path(__file__).resolve().parent))

from lean_round import _Timer, medians
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


class _DropRows(L.pytorch.loggers.Logger):
    name = "drop"  # type: ignore[assignment]
    version = 0  # type: ignore[assignment]

    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        pass

    def log_hyperparams(self, *args: object, **kwargs: object) -> None:
        pass


class _LogsOnly(L.LightningModule):
    def __init__(self, mode: str, values: int) -> None:
        super().__init__()
        self.automatic_optimization = False
        self.mode, self.values = mode, values
        self.w = torch.nn.Parameter(torch.zeros(1))

    def training_step(self, batch: object, batch_idx: int) -> None:
        row = {f"m{k}": float(k) for k in range(self.values)}
        if self.mode == "self.log":
            for name, value in row.items():
                self.log(name, value, on_step=True, on_epoch=False)
        elif self.mode == "log_dict":
            self.log_dict(row, on_step=True, on_epoch=False)
        elif self.mode == "logger":
            for logger in self.trainer.loggers:
                logger.log_metrics(row, step=self.global_step)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)

    def train_dataloader(self) -> list[int]:
        return [0] * 300


def bare(repeats: int) -> None:
    """CPU ms per step of a Trainer step that only logs, by way of logging."""
    arms = (("nothing", 0), ("self.log", 20), ("log_dict", 20), ("logger", 20))
    times: dict[str, list[float]] = {mode: [] for mode, _ in arms}
    for _ in range(repeats):
        for mode, values in arms:
            trainer = L.Trainer(
                max_epochs=1,
                logger=_DropRows(),
                log_every_n_steps=1,
                enable_progress_bar=False,
                enable_checkpointing=False,
                enable_model_summary=False,
            )
            started = time.process_time()
            trainer.fit(_LogsOnly("self.log" if mode == "nothing" else mode, values))
            times[mode].append((time.process_time() - started) / 300 * 1e3)
    for mode, _ in arms:
        print(f"bare step logging {mode}: median {statistics.median(times[mode]):.3f} CPU ms per step")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bare", action="store_true", help="time Lightning's logging alone and stop")
    parser.add_argument("--data-root")
    parser.add_argument("--workload", default="S0", help="a workload id of benchmarks/perf/workloads.py")
    parser.add_argument("--rounds", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(1)
    if args.bare:
        bare(args.repeats)
        return
    if args.data_root is None:
        parser.error("--data-root is required: the folder holding the workload's data set (e.g. ../shared/data)")
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
    for what, name, m, base in medians(times, "per-value"):
        print(
            f"{args.workload} {what}: {name} round median {m * 1e3:.2f} ms over {len(times[name])} rounds; "
            f"ratio to per-value {m / base:.3f}"
        )


if __name__ == "__main__":
    main()
